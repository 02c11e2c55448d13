"""A tuned training module trains as the original does (tuner.tune_train's contract)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from examples.models import RecSys
from examples.training import export_for_training, recsys_train
from tuner.apply import apply_passes, count_ops
from tuner.capture import export_module, save_program, to_graph_module
from tuner.passes import get_pass, pass_names
from tuner.training import loss_of
from tuner.tune import TuneOptions, tune_program


def _losses(model: torch.nn.Module, batches: list[tuple], lr: float) -> list[float]:
    """Plain SGD steps, dropout seeded per step (the global RNG is restored)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step, inputs in enumerate(batches):
        with torch.random.fork_rng():
            torch.manual_seed(step)
            opt.zero_grad()
            loss = loss_of(model(*inputs))
            loss.backward()
            opt.step()
        losses.append(float(loss.detach()))
    return losses


def test_tuned_recsys_trains_like_the_original_for_50_sgd_steps(tmp_path: Path) -> None:
    example = recsys_train(batch=32, num_sparse=8)  # the example's shape, fewer features
    original = copy.deepcopy(example.module)
    program = export_for_training(example)
    # Every training-safe pass that keeps the call signature (combine_sparse_inputs packs it).
    names = [n for n in pass_names() if get_pass(n).train_safe and n != "combine_sparse_inputs"]
    tuned_gm = apply_passes(program, names, train=True)
    assert {s.pass_name for s in tuned_gm.applied} >= {
        "fuse_horizontal_embedding_bag",
        "fuse_horizontal_layernorm",
        "fuse_horizontal_linear",
    }
    assert count_ops(tuned_gm.gm) < count_ops(to_graph_module(program))
    path = save_program(tuned_gm.to_program(), tmp_path / "tuned.pt2")
    tuned = torch.export.load(path).module()  # plain torch from here on

    batches = [example.fresh_inputs(seed) for seed in range(50)]
    expected = _losses(original, batches, lr=0.05)
    got = _losses(tuned, batches, lr=0.05)
    assert expected[-1] < expected[0] - 0.05  # it did train
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)

    fresh = RecSys(num_sparse=8)
    fresh.load_state_dict(tuned.state_dict())  # strict: the original's keys, nothing else
    for name, value in original.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[name], value, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_compiled_training_steps_are_checked_timed_and_compared(tmp_path: Path) -> None:
    """torch.compile of a step with dropout passes the check (inductor's fallback_random draws
    eager's masks), is timed, and the shipped step is timed against it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 4)
    )
    program = export_module(model.train(), (torch.randn(16, 32),))
    options = TuneOptions(
        mode="train",
        optimizer="adamw",
        backends=["eager", "compile"],
        budget_s=300,  # a limit: the run ends when its candidates are done
        whole_model_budget_s=2,
        cache_path=tmp_path / "c.json",
    )
    config = tune_program(program, options).config
    (peer,) = [c for c in config.candidates if c.name == "compile"]
    assert peer.verdict not in ("wrong outputs", "failed to run"), peer.reason
    assert peer.rounds > 0
    if config.whole_model.name != "compile":
        versus = config.tuning["versus_compile"]
        assert versus["rounds"] > 0 and versus["speedup"] > 0
