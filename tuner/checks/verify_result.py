"""Checking a worker's tuned program against the original upload before it is stored.

A worker's result is not trusted: whoever holds a lease could send a program with the same graph
(so the same fingerprint) and other weights, which would then be served as the tuned model and
answer wrongly. So the service checks what it is sent: both programs load through the safe
loader, the original's config is replayed only for its input packing (`combine_sparse_inputs`
changes the signature), and the tuned program runs, on the CPU (a CUDA worker's program has its
device baked into ops; torch's own pass moves it), on the example inputs and fresh variants of
them with the tuner's own tolerance (`tuner.measure.equivalence.check_outputs`). A training
step is checked as the tuner checks one (outputs, loss, every gradient;
`tuner.training.step.check_training`). The AOTInductor package is never loaded here: it stays an
opaque file, and `load_tuned` checks what it runs at deployment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tuner.deploy.replay import apply_config
from tuner.graph.capture import example_inputs, on_device
from tuner.loading.load import load_program
from tuner.measure.equivalence import check_outputs
from tuner.measure.inputs import fresh_inputs

TRIALS = 3


def verify_tuned(original_path: Path, tuned_path: Path, config: dict[str, Any]) -> str | None:
    """None when the tuned program answers as the original does; else the reason."""
    original = on_device(load_program(original_path), "cpu")
    tuned = on_device(load_program(tuned_path), "cpu")  # a CUDA worker's: devices baked in
    pack = apply_config(original, config).pack
    inputs = example_inputs(original)
    trials = [inputs, *fresh_inputs(inputs, TRIALS, seed=1234)]
    reference, candidate = original.module(), tuned.module()
    if config.get("mode") == "train":
        from tuner.training.step import check_training, eager_runner

        optimizer = (config.get("training") or {}).get("optimizer")
        runner = eager_runner(candidate, optimizer, torch.device("cpu"))
        return check_training(reference, runner, trials, optimizer, pack=pack)
    return check_outputs(reference, lambda *args: candidate(*pack(args)), trials)
