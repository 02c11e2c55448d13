"""Sharded programs on real process groups: ranks, lockstep timing where the slowest rank
decides, the overlap profile, and the distributed tuner."""
