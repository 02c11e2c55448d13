"""The FXTUNE_ settings the whole test run shares, its services and workers included.

- The run's own decision cache: by default `fxtune tune` and workers keep decisions (and the
  compile-time history beside them) in the user's ~/.cache/fxtune, and a test run must neither
  read what the user's runs measured nor leave its own there. tests/conftest.py points these
  at a folder of the run.
- The comparisons' stopping rule (`tuner.measure.timing.StopSettings`): a 15 % interval or 20
  rounds, not 2 % or 200; the tests check what the tuner decides and why, not differences of a
  few percent. A worker passes it on to its tuning children (FXTUNE_WORKER_CHILD_ENV).

`tests.service.helpers.fxtune_env`, which drops the other FXTUNE_ settings, passes these on.
"""

RUN_CACHE_ENV = ("FXTUNE_TUNE_CACHE", "FXTUNE_WORKER_DECISION_CACHE")
RUN_TIMING = {"FXTUNE_TIMING_TARGET_CI": "0.15", "FXTUNE_TIMING_MAX_ROUNDS": "20"}
