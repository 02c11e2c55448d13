"""The settings that point fxtune's default decision cache at the test run's own folder.

By default `fxtune tune` and workers keep decisions (and the compile-time history beside them)
in the user's ~/.cache/fxtune: a test run must neither read what the user's runs measured nor
leave its own there. tests/conftest.py sets these for the run, and
`tests.service.helpers.fxtune_env`, which drops the other FXTUNE_ settings, passes them on.
"""

RUN_CACHE_ENV = ("FXTUNE_TUNE_CACHE", "FXTUNE_WORKER_DECISION_CACHE")
