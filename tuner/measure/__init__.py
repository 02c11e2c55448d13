"""Timing with statistics: interleaved A/B rounds, one summary of paired ratios with its
interval, and the verdict drawn from it."""
