"""fxtune's tuning library: load, capture, passes, sites, measure, profile, search, config, apply.

It depends on nothing else in this repository; the service and the worker depend on it.
"""
