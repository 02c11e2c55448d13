"""One Tuner, the mode as a strategy: each Mode has one step kind, the Tuner takes its kind from
the registry, and options that belong to one mode are refused in another."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest
import torch
from torch import nn

from tuner.contract.config import Mode, TunedConfig
from tuner.contract.errors import InputError
from tuner.graph.capture import to_graph_module
from tuner.passes import get_pass
from tuner.search.site_search import FORWARD, FORWARD_BACKWARD
from tuner.tuning.inference import InferenceStep
from tuner.tuning.modes import STEP_KINDS, step_kind_for
from tuner.tuning.options import MODE_ONLY, TuneOptions
from tuner.tuning.step_kind import StepKind
from tuner.tuning.train import TrainingStep
from tuner.tuning.tuner import Tuner, tuning_session

# What a step kind must answer (`tuner.tuning.step_kind.StepKind`).
PROTOCOL = [
    name
    for name in vars(StepKind)
    if not name.startswith("_") and name not in ("mode", "site_run", "compiling")
]


def test_every_mode_has_one_step_kind_and_nothing_else_does() -> None:
    assert sorted(STEP_KINDS) == sorted(get_args(Mode))
    assert {"infer": InferenceStep, "train": TrainingStep} == STEP_KINDS
    for mode, kind in STEP_KINDS.items():
        assert kind.mode == mode and step_kind_for(mode) is kind
        assert all(callable(getattr(kind, name, None)) for name in PROTOCOL), kind
    assert InferenceStep.site_run is FORWARD and TrainingStep.site_run is FORWARD_BACKWARD
    assert set(PROTOCOL) >= {"capture", "candidates", "build", "check", "verify", "finish"}


@pytest.mark.parametrize("mode", get_args(Mode))
def test_the_tuner_runs_its_modes_kind(mode: Mode, tmp_path: Path) -> None:
    with tuning_session(TuneOptions(mode=mode, workdir=tmp_path)) as session:
        tuner = Tuner(session)
    assert type(tuner.kind) is STEP_KINDS[mode]
    assert tuner.kind.run is tuner.run and tuner.budget.kind is tuner.kind


def test_a_mode_only_option_is_refused_in_another_mode() -> None:
    assert MODE_ONLY == {"optimizer": ("train",)}
    with pytest.raises(InputError, match="--optimizer applies to --mode train only"):
        TuneOptions(mode="infer", optimizer="sgd")
    assert TuneOptions(mode="train", optimizer="sgd").optimizer == "sgd"  # the control
    with pytest.raises(InputError, match="unknown mode 'serve'; known: infer, train"):
        TuneOptions(mode="serve")  # type: ignore[arg-type]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.relu(self.fc(x)))


def test_the_kinds_differ_in_passes_baseline_and_profiled_step(tmp_path: Path) -> None:
    infer = Tuner(TuneOptions(workdir=tmp_path)).kind
    train = Tuner(TuneOptions(mode="train", optimizer="sgd", workdir=tmp_path)).kind
    assert set(train.passes()) < set(infer.passes())
    assert all(get_pass(p).train_safe for p in train.passes())
    assert not all(get_pass(p).train_safe for p in infer.passes())
    with pytest.raises(InputError, match="not valid in a training step: remove_dropout"):
        Tuner(TuneOptions(mode="train", passes=["remove_dropout"], workdir=tmp_path)).kind.passes()
    x = torch.randn(4, 8)
    gm = to_graph_module(torch.export.export(Net().train(), (x,)), train=True)
    assert infer.baseline(gm) is gm  # the forward itself
    step = train.baseline(gm)  # an eager training step (its loss), on a copy of the module
    before = {k: v.clone() for k, v in gm.state_dict().items()}
    assert step(x).dim() == 0 and step(x).requires_grad
    assert all(torch.equal(before[k], v) for k, v in gm.state_dict().items())
    config = TunedConfig.model_validate(
        {
            "mode": "train",
            "training": {"optimizer": "sgd", "loss": "x"},
            "model_fingerprint": "f",
            "hardware": {},
            "backend": "eager",
            "passes": [],
            "sites": [],
            "candidates": [],
            "whole_model": {"name": "o", "backend": "eager", "passes": [], "verdict": "faster"},
            "verification": {"inputs": 0, "max_abs_error": 0, "max_rel_error": 0, "passed": True},
            "tuning": {},
        }
    )
    assert InferenceStep.profiled_baseline(gm, config, torch.device("cpu")) is gm
    profiled = TrainingStep.profiled_baseline(gm, config, torch.device("cpu"))
    assert profiled is not gm and profiled(x).dim() == 0


def test_each_kind_estimates_its_own_compiles_and_the_budget_says_so(tmp_path: Path) -> None:
    """A forward compile and a training-step compile are kept apart in the store, and with
    nothing measured a compile in the tuner's own process (torch.compile, which nothing could
    stop) starts only where half as much again as its prior fits."""
    from tuner.host.load import CoreLoad
    from tuner.passes.apply import Transformed
    from tuner.tuning.candidates import Candidate
    from tuner.tuning.train import COMPILE_KEY

    cache = tmp_path / "decisions.json"
    gm = torch.fx.symbolic_trace(Net())
    cand = Candidate("compile", "compile", [], Transformed(gm, (torch.randn(4, 8),)))
    nodes = len(gm.graph.nodes)
    quiet = CoreLoad(2)  # the priors as they are, whatever else the cores are doing
    infer = Tuner(TuneOptions(cache_path=cache, workdir=tmp_path, load=quiet))
    train = Tuner(TuneOptions(mode="train", cache_path=cache, workdir=tmp_path, load=quiet))
    # The prior: 5 s + 0.06 s a node, 1.5x that in process: about 8.5 s, plus 2 s to time it.
    assert infer.budget.compile_wont_fit(cand, 12.0) is None
    assert train.budget.compile_wont_fit(cand, 12.0) is None
    for tuner in (infer, train):
        late = tuner.budget.compile_wont_fit(cand, 8.0)
        assert late is not None and late.startswith("skipped: nothing measured here yet"), late
    train.run.compile_times.record(train.run.hardware_key, COMPILE_KEY, nodes, 30.0)
    slow = train.budget.compile_wont_fit(cand, 20.0)
    assert slow is not None and "compiling the training step is estimated at 30 s" in slow
    assert train.budget.compile_wont_fit(cand, 40.0) is None  # the control: it fits
    # A forward run on the same store (read afresh) does not take the training compile as its.
    again = Tuner(TuneOptions(cache_path=cache, workdir=tmp_path, load=quiet))
    assert again.run.compile_times.samples(again.run.hardware_key, COMPILE_KEY)
    assert again.budget.compile_wont_fit(cand, 20.0) is None
    eager = Candidate("eager", "eager", [], cand.transformed)
    assert train.budget.compile_wont_fit(eager, 0.0) is None  # eager compiles nothing
