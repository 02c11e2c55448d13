"""fxtune workers: claim jobs over HTTP, tune each in a limited child process, report back.

Depends on the tuner (run as a child command) and talks to the service only over HTTP.
"""
