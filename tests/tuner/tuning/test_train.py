"""The tuner in training mode (tuner.tuning.train): a tuned module trains as the original does,
candidates are checked before they are timed, and the command line."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from examples.models import RecSys
from examples.training import export_for_training, recsys_train
from fxtune_cli import app
from tests.tuner.tuning_fixtures import HalfGradRelu, registered, relu_net_program
from tuner.contract.config import TunedConfig
from tuner.graph.capture import export_module, save_program, to_graph_module
from tuner.passes import get_pass, pass_names
from tuner.passes.apply import apply_passes, count_ops
from tuner.training.step import loss_of
from tuner.tuning.tuner import TuneOptions, tune_program


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
        whole_model_budget_s=3,
        threads=1,  # two threads on two shared cores stall tiny kernels for milliseconds
        cache_path=tmp_path / "c.json",
    )
    config = tune_program(program, options).config
    (peer,) = [c for c in config.candidates if c.name == "compile"]
    assert peer.verdict not in ("wrong outputs", "failed to run"), peer.reason
    assert peer.rounds > 0
    if config.whole_model.name != "compile":
        versus = config.tuning["versus_compile"]
        assert versus["rounds"] > 0 and versus["speedup"] > 0


@pytest.mark.serial  # its check must run before a 20 s budget is spent
def test_tuner_rejects_the_planted_gradient_bug_before_timing(tmp_path: Path) -> None:
    program, _ = relu_net_program()
    options = TuneOptions(
        mode="train",
        optimizer="sgd",
        passes=["test_half_grad_relu"],
        backends=["eager", "inductor"],
        budget_s=20,
        cache_path=tmp_path / "cache.json",
    )
    with registered(HalfGradRelu):
        outcome = tune_program(program, options)
    config = outcome.config
    # Its site, timed forward + backward in training, is rejected on its gradient untimed...
    (site,) = config.sites
    assert site.verdict == "wrong outputs" and "gradient of input" in (site.reason or "")
    assert site.rounds == 0 and not site.accepted
    # ...so there are no winning sites, and the whole step is rejected as well.
    (cand,) = config.candidates
    assert cand.name == "eager + every pass"
    assert cand.verdict == "wrong outputs"
    assert "gradient of fc1." in (cand.reason or "")
    assert cand.rounds == 0 and cand.speedup is None
    assert not any(key.startswith("model:") for key in outcome.samples)
    assert config.tuning["timed_candidates"] == 0
    assert config.whole_model.name == "original"
    assert config.mode == "train"
    assert config.training is not None and config.training.optimizer == "sgd"
    # AOTInductor has no backward: never a training candidate, and the report says so.
    assert any("inductor" in note and "inference-only" in note for note in config.tuning["notes"])


def test_an_eval_mode_export_is_tuned_with_a_note_saying_so() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
    x = (torch.randn(4, 8),)
    options = TuneOptions(mode="train", backends=["eager"], passes=[], budget_s=10)
    notes = tune_program(export_module(module.eval(), x), options).config.tuning["notes"]
    assert any("exported in eval mode (dropout)" in n for n in notes)
    notes = tune_program(export_module(module.train(), x), options).config.tuning["notes"]
    assert not any("eval mode" in n for n in notes)


def test_cli_tunes_a_training_step(tmp_path: Path) -> None:
    program, x = relu_net_program()
    model = save_program(program, tmp_path / "m.pt2")
    out, report = tmp_path / "out" / "tuned.pt2", tmp_path / "out" / "report.json"
    args = ["tune", str(model), "--out", str(out), "--report", str(report)]
    args += ["--mode", "train", "--optimizer", "adamw", "--budget-s", "15", "--backend", "eager"]
    args += ["--cache", str(tmp_path / "c.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(report.read_text())
    config = TunedConfig.model_validate(doc["config"])
    assert config.mode == "train" and config.training and config.training.optimizer == "adamw"
    assert set(doc["profiles"]) == {"baseline", "tuned"}
    # The written program trains with plain torch: gradients reach its parameters.
    tuned = torch.export.load(out).module()
    loss_of(tuned(*x)).backward()
    assert all(p.grad is not None for p in tuned.parameters())
    bad = CliRunner().invoke(app, [*args[:5], "--mode", "infer", "--optimizer", "sgd"])
    assert bad.exit_code == 2, bad.output


def test_tuning_leaves_batch_norm_statistics_as_exported(tmp_path: Path) -> None:
    """A training graph's batch norm updates its running statistics on every call: neither
    checking nor verifying may run the module that ships (nor the original it replays)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten()
    )
    program = export_module(model.train(), (torch.randn(4, 3, 12, 12),))
    exported = {k: v.clone() for k, v in program.state_dict.items()}
    options = TuneOptions(
        mode="train", backends=["eager"], passes=["channels_last"], budget_s=30, threads=1
    )
    outcome = tune_program(program, options)
    assert outcome.config.candidates[0].verdict in ("faster", "slower", "within noise")
    shipped = outcome.tuned.to_program().state_dict
    for name, value in exported.items():
        torch.testing.assert_close(shipped[name], value, rtol=0, atol=0)
        torch.testing.assert_close(program.state_dict[name], value, rtol=0, atol=0)
    assert "running_mean" in " ".join(exported)
