import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile
from typer.testing import CliRunner

import fxtune_cli
from tuner.contract.errors import DeviceUnavailableError, UnsupportedDeviceError
from tuner.graph.capture import export_module, save_program
from tuner.profiling.analysis import ITERATION
from tuner.profiling.categories import CATEGORIES
from tuner.profiling.counting import count_dispatched_ops, inductor_kernel_ranges
from tuner.profiling.profile import (
    ProfileError,
    ProfileSummary,
    breakdown_frame,
    events_frame,
    profile_callable,
)

N, D, B = 10, 8, 4


class SplitNormTanh(nn.Module):
    """The seed's pattern: split -> N x (LayerNorm -> Tanh) -> cat: 22 ATen ops."""

    def __init__(self) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(D) for _ in range(N))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(x, D, dim=1)
        outs = [torch.tanh(norm(p)) for norm, p in zip(self.norms, pieces, strict=True)]
        return torch.cat(outs, dim=1)


class FusedNormTanh(nn.Module):
    """Its horizontally fused form: one norm and one tanh on a (B, N, D) view."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.norm(x.view(B, N, D))).view(B, N * D)


@pytest.fixture(scope="module")
def split_summary() -> ProfileSummary:
    x = torch.randn(B, N * D)
    model = SplitNormTanh().eval()
    return profile_callable(lambda: model(x), iterations=4, warmup=1)


def test_ops_per_iter_is_the_number_of_aten_calls() -> None:
    x, w, b = torch.randn(4, 16), torch.randn(16, 16), torch.randn(16)
    summary = profile_callable(lambda: torch.relu(torch.mm(x, w) + b), iterations=2, warmup=1)
    assert summary.ops_per_iter == 3
    linear = nn.Linear(16, 16)
    with torch.no_grad():
        counts = count_dispatched_ops(lambda: linear(x))
    assert counts == {"aten.t.default": 1, "aten.addmm.default": 1}


def test_split_norm_tanh_shows_norm_and_pointwise(split_summary: ProfileSummary) -> None:
    s = split_summary
    assert s.ops_per_iter == 2 * N + 2
    assert set(s.time_by_category_us) == set(CATEGORIES)
    for category in ("norm", "pointwise", "data_movement"):
        assert s.time_by_category_us[category] > 0
    assert s.time_by_category_us["matmul_conv"] == 0
    by_name = {op["name"]: op for op in s.top_ops}
    assert by_name["aten::tanh"]["calls_per_iter"] == N
    assert by_name["aten::tanh"]["category"] == "pointwise"
    assert by_name["aten::native_layer_norm"]["category"] == "norm"


def test_fused_form_dispatches_fewer_ops(split_summary: ProfileSummary) -> None:
    x = torch.randn(B, N * D)
    fused = FusedNormTanh().eval()
    summary = profile_callable(lambda: fused(x), iterations=2, warmup=1)
    assert summary.ops_per_iter == 4
    assert split_summary.ops_per_iter is not None
    assert summary.ops_per_iter < split_summary.ops_per_iter


def test_categories_and_overhead_add_up_to_wall(split_summary: ProfileSummary) -> None:
    s = split_summary
    op_time = sum(s.time_by_category_us.values())
    assert 0 < op_time < s.wall_us_per_iter
    assert s.cpu_dispatch_overhead_us is not None
    assert op_time + s.cpu_dispatch_overhead_us == pytest.approx(s.wall_us_per_iter)


def test_events_frame_matches_profiler_self_times() -> None:
    x = torch.randn(B, N * D)
    model = SplitNormTanh().eval()
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(x)
    events = events_frame(prof)
    expected = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key.startswith("aten::"))
    assert events["self_us"].sum() == pytest.approx(expected, rel=1e-6)
    assert events["device_us"].isna().all()
    assert events.set_index("name").loc["aten::native_layer_norm", "calls"] == N
    assert str(events["category"].dtype) == "string"


def test_cpu_missing_figures_are_none_with_reasons(split_summary: ProfileSummary) -> None:
    s = split_summary
    assert s.kernels_per_iter is None and s.device_idle_us is None
    assert "eager" in (s.reason("kernels_per_iter") or "")
    assert s.reason("device_idle_us")
    assert s.reason("ops_per_iter") is None
    # the output of each iteration (B x N*D floats) is allocated while profiling
    assert s.peak_memory_bytes is not None and s.peak_memory_bytes >= B * N * D * 4
    assert s.trace_path is None
    assert json.loads(json.dumps(s.to_dict()))["ops_per_iter"] == 2 * N + 2


def test_chrome_trace_is_written_as_json(tmp_path: Path) -> None:
    x = torch.randn(4, 4)
    trace = tmp_path / "traces" / "t.json"
    summary = profile_callable(lambda: torch.tanh(x), iterations=3, warmup=0, trace_path=trace)
    assert summary.trace_path == str(trace)
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(1 for e in events if e.get("name") == ITERATION) == 3
    assert any(e.get("name") == "aten::tanh" for e in events)


def test_refuses_what_it_cannot_profile() -> None:
    with pytest.raises(UnsupportedDeviceError, match="unknown device"):
        profile_callable(lambda: None, device="tpu")
    with pytest.raises(ProfileError, match="iterations"):
        profile_callable(lambda: None, iterations=0)
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError, match="cuda"):
            profile_callable(lambda: None, device="cuda")


def test_breakdown_frame_compares_summaries(split_summary: ProfileSummary) -> None:
    unmeasured = ProfileSummary(
        device="cuda",
        iterations=1,
        ops_per_iter=None,
        kernels_per_iter=None,
        time_by_category_us={},
        wall_us_per_iter=1.0,
        cpu_dispatch_overhead_us=None,
        device_idle_us=None,
        peak_memory_bytes=None,
        trace_path=None,
    )
    frame = breakdown_frame({"baseline": split_summary, "tuned": unmeasured})
    assert list(frame.columns) == [
        "category",
        "baseline_us",
        "baseline_share",
        "tuned_us",
        "tuned_share",
    ]
    assert list(frame["category"]) == list(CATEGORIES)
    assert str(frame["category"].dtype) == "string"
    assert str(frame["baseline_us"].dtype) == "float64"
    assert frame["baseline_share"].sum() == pytest.approx(1.0)
    norm = frame.set_index("category").loc["norm"]
    assert norm["baseline_us"] == split_summary.time_by_category_us["norm"]
    assert math.isnan(norm["tuned_us"]) and math.isnan(norm["tuned_share"])


def test_cli_profiles_a_saved_program(tmp_path: Path) -> None:
    model = SplitNormTanh().eval()
    path = save_program(export_module(model, (torch.randn(B, N * D),)), tmp_path / "m.pt2")
    trace = tmp_path / "trace.json"
    result = CliRunner().invoke(
        fxtune_cli.app, ["profile", str(path), "--iterations", "2", "--trace", str(trace)]
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "time by category" in out
    for category in ("norm", "pointwise", "data_movement"):
        assert category in out
    assert f"ops/iter: {2 * N + 2}" in out
    assert "kernels/iter: n/a (" in out
    assert "device idle: n/a (" in out
    assert f"trace:{trace}" in "".join(out.split())  # rich wraps a long path at 80 columns
    assert json.loads(trace.read_text())["traceEvents"]


def test_cli_reports_bad_device(tmp_path: Path) -> None:
    args = ["profile", str(tmp_path / "x.pt2"), "--device", "tpu"]
    result = CliRunner().invoke(fxtune_cli.app, args)
    assert result.exit_code == 2
    assert "unknown device" in result.output


@pytest.mark.slow
def test_counts_inductor_cpp_kernels() -> None:
    def chain(x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = torch.tanh(x) + 1
        return x @ x.T

    x = torch.randn(8, 16)
    compiled = torch.compile(chain)
    with inductor_kernel_ranges(), torch.no_grad():
        compiled(x)
    summary = profile_callable(lambda: compiled(x), iterations=2, warmup=1)
    assert summary.kernels_per_iter is not None and summary.kernels_per_iter >= 1
    # only the extern matmul is an ATen op; the fused tanh/add chain is a generated kernel
    assert summary.ops_per_iter is not None and summary.ops_per_iter <= 2
    assert summary.time_by_category_us["pointwise"] > 0


def test_a_training_step_is_profiled_by_phase(split_summary: ProfileSummary) -> None:
    """Issue 12: forward (with the loss), backward and the optimizer step apart, each with the
    kinds of op it runs (layer norm forward and backward, no norm in the SGD update)."""
    from tuner.training.step import eager_runner

    x = torch.randn(B, N * D)
    runner = eager_runner(SplitNormTanh(), "sgd")
    summary = profile_callable(lambda: runner.step(x), iterations=3, warmup=1)
    assert list(summary.phases) == ["forward", "backward", "optimizer"]
    forward, backward, optimizer = summary.phases.values()
    assert forward["op_calls_per_iter"] > 0 and backward["op_calls_per_iter"] > 0
    assert forward["time_by_category_us"]["norm"] > 0
    assert backward["time_by_category_us"]["norm"] > 0  # native_layer_norm_backward
    assert optimizer["time_by_category_us"]["norm"] == 0
    assert optimizer["op_calls_per_iter"] >= 1
    walls = sum(p["wall_us_per_iter"] for p in summary.phases.values())
    assert walls <= summary.wall_us_per_iter
    assert all(p["kernels_per_iter"] is None for p in summary.phases.values())  # CPU: eager ops
    assert split_summary.phases == {}  # inference has no phases
