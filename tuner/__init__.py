"""fxtune's tuning library. Each subpackage is one concern, in layers from the bottom up:

contract (torch-free) < host < graph < loading < passes < measure < profiling < backends
< training < search < deploy < tuning < distributed < checks < cli

A module imports only from its own layer or below (tests/tuner/test_layers.py). The library
depends on nothing else in this repository; the service and the worker depend on it.
"""
