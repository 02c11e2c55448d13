"""Pieces of `tuner.profiling.profile`: op categories, profiler events as DataFrames, and their
reductions.

The reductions (`analysis`) are pure functions of DataFrames, so the GPU arithmetic (launch to
kernel joins, idle time) is tested with synthetic event tables on machines without a GPU.
"""
