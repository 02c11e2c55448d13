"""A runtime as the backend that ships: chosen by measurement, its artifact written as timed.

One short tune of a model ONNX Runtime is sure to win on (sixty small pointwise ops: eager
pays a dispatch for each, 8x the fused session's time here), under eager and ONNX Runtime only.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tuner.backends.runtimes import installed_version
from tuner.contract.config import SCHEMA_VERSION, TunedConfig
from tuner.graph.capture import export_module
from tuner.tuning.judge import CLEARLY_SLOWER
from tuner.tuning.outputs import write_outputs
from tuner.tuning.tuner import TuneOptions, Tuner, tune_program, tuning_session

pytestmark = pytest.mark.skipif(
    installed_version("onnxruntime") is None, reason="onnxruntime not installed"
)


class Chain(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(60):
            x = torch.tanh(x * 1.01 + 0.1) if i % 2 else torch.sigmoid(x - 0.2)
        return x


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[TunedConfig, dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("runtime-tune")
    program = export_module(Chain(), (torch.randn(8, 32),))
    options = TuneOptions(
        budget_s=25,
        backends=["eager", "onnxruntime"],
        whole_model_budget_s=2.5,  # rounds pause 0.2 s beside a runtime: 1 s fitted 5 of 6
        threads=1,
        workdir=out / "work",
        cache_path=out / "cache.json",
    )
    with tuning_session(options) as session:
        outcome = Tuner(session).tune(program)
        write_outputs(outcome, out / "tuned.pt2", out / "report.json", profile=False)
    report = json.loads((out / "report.json").read_text())
    return TunedConfig.model_validate(report["config"]), report["artifacts"], out


def test_the_runtime_peer_is_judged_and_ships_as_the_file_that_was_timed(
    shipped: tuple[TunedConfig, dict[str, Any], Path],
) -> None:
    config, artifacts, out = shipped
    peer = next(f for f in config.candidates if f.name == "onnxruntime")
    assert peer.verdict == "faster" and peer.rounds > 0, peer
    assert config.backend == "onnxruntime", [(f.name, f.speedup) for f in config.candidates]
    onnx_file = out / artifacts["runtime"]
    assert onnx_file.name == "tuned.onnx"
    assert config.runtime is not None and config.runtime.format == "onnx"
    assert config.runtime.version == installed_version("onnxruntime")
    assert config.runtime.sha256 == hashlib.sha256(onnx_file.read_bytes()).hexdigest()
    assert config.verification.passed and config.verification.inputs > 0


def test_the_config_says_what_ran_under_what_and_what_runs_without_the_runtime(
    shipped: tuple[TunedConfig, dict[str, Any], Path],
) -> None:
    config, _, _ = shipped
    assert config.schema_version == SCHEMA_VERSION == 6
    assert config.fallback is not None and config.fallback.backend == "eager"
    under = {row.backend: row for row in config.measured_under.backends}
    assert under["eager"].alone == 1.0
    assert under["onnxruntime"].alone == pytest.approx(config.whole_model.speedup, rel=0.5)
    assert config.measured_under.site_backend == "eager"
    assert "onnxruntime ships" in config.measured_under.notes[0]
    assert config.tuning["runtimes"]["onnxruntime"] == installed_version("onnxruntime")


class Bags(nn.Module):
    """Embedding bags, which ONNX Runtime runs at a few percent of eager's speed."""

    def __init__(self) -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(1000, 16, mode="sum") for _ in range(8))

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return torch.cat([bag(indices, offsets) for bag in self.bags], dim=1)


def test_a_runtime_clearly_slower_at_the_first_size_is_not_compared_or_timed_further(
    tmp_path: Path,
) -> None:
    """Its best calls are over `CLEARLY_SLOWER` times the original's: recorded as slower from
    them, without an interleaved comparison, and not judged at the other sizes (its artifact
    would serve every size, so it cannot ship)."""
    batch = torch.export.Dim("batch", min=2, max=4096)
    indices = torch.randint(0, 1000, (3 * 256,))
    offsets = torch.arange(0, 3 * 256, 3)
    program = torch.export.export(
        Bags().eval(),
        (indices, offsets),
        dynamic_shapes=({0: torch.export.Dim.STATIC}, {0: batch}),
        strict=False,
    )
    options = TuneOptions(
        budget_s=30,
        backends=["eager", "onnxruntime"],
        passes=["remove_dropout"],
        whole_model_budget_s=1.0,
        threads=1,
        workdir=tmp_path,
        cache_path=tmp_path / "cache.json",
    )
    outcome = tune_program(program, options)
    config = outcome.config
    assert len(outcome.points) > 1, outcome.points  # a dynamic program, tuned at several sizes
    peer = next(f for f in config.candidates if f.name == "onnxruntime")
    assert peer.verdict == "slower" and peer.rounds == 0, peer
    assert "not compared further" in (peer.reason or "") + str(peer.per_size), peer
    assert peer.speedup is not None and peer.speedup < 1 / CLEARLY_SLOWER
    assert len(peer.per_size) == 1, peer.per_size  # the other sizes were not worth their time
