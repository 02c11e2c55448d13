"""The fxtune service: HTTP API, database, job queue and artifact store.

It depends on the tuner (for cheap format checks) and never on the worker: an embedded worker is a
child process that talks HTTP like any other.
"""
