"""The pipeline: capture, site search, whole-model candidates, judge, choose, verify, write
the outputs. `tune_program` is the entry point."""
