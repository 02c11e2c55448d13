"""Measuring a candidate against the original: inputs to run them on (`inputs`), whether they
compute the same (`equivalence`: one tolerance rule), how fast each runs (`timing`: one round
loop, locally or on ranks in lockstep), the statistics of paired samples (`summary`) and what
a comparison amounts to (`verdicts`)."""
