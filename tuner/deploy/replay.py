"""Replaying a tuned config on the original program: the tuned module again, nothing measured.

`apply_config` re-finds each recorded step's sites by structural id in the original program, so
the tuned module is reproduced exactly from the original plus the config's JSON.
"""

from __future__ import annotations

import json
from typing import Any

from torch.export import ExportedProgram

from tuner.contract.config import Bucket, PassStep, TunedConfig
from tuner.graph.capture import example_inputs, to_graph_module
from tuner.passes.apply import Transformed, apply_steps


def steps_of(passes: list[PassStep]) -> list[tuple[str, set[str]]]:
    return [(step.pass_name, set(step.sites)) for step in passes if step.sites]


def _as_config(config: TunedConfig | dict[str, Any]) -> TunedConfig:
    if isinstance(config, dict):
        return TunedConfig.model_validate(json.loads(json.dumps(config)))
    return config


def apply_config(program: ExportedProgram, config: TunedConfig | dict[str, Any]) -> Transformed:
    """Reproduce the tuned module from the original program deterministically, measuring nothing.

    For a config with size buckets this is the example size's bucket; `apply_buckets` gives
    every bucket's module, and `tuner.deploy.dispatch.SizeDispatch` runs the right one per call.
    """
    config = _as_config(config)
    return replay_steps(program, config.passes, train=config.mode == "train")


def apply_buckets(
    program: ExportedProgram, config: TunedConfig | dict[str, Any]
) -> list[tuple[Bucket, Transformed]]:
    """Each bucket's decision replayed on its own fresh copy of the original (none: [])."""
    return [(b, replay_steps(program, b.passes)) for b in _as_config(config).buckets]


def replay_steps(
    program: ExportedProgram, passes: list[PassStep], *, train: bool = False
) -> Transformed:
    """The recorded steps applied to a fresh copy of the original: what a config replays to."""
    gm = to_graph_module(program, train=train)
    return apply_steps(gm, example_inputs(program), steps_of(passes))
