"""The compute floor: FLOPs counted as the model's GEMMs and convolutions do them, over a peak
this machine actually reached."""

from __future__ import annotations

import torch
from torch import nn

from bench import roofline
from tuner.graph.capture import export_module


class Attention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(q, k, v)


def test_a_linear_counts_two_flops_a_multiply_add() -> None:
    program = export_module(nn.Linear(32, 16).eval(), (torch.randn(8, 32),))
    assert roofline.program_flops(program) == 2 * 8 * 32 * 16


def test_attention_counts_its_two_matmuls() -> None:
    """SDPA's CPU kernel has no FLOP formula in torch; its math form does."""
    b, h, n, d = 2, 4, 16, 8
    q = torch.randn(b, h, n, d)
    program = export_module(Attention().eval(), (q, q.clone(), q.clone()))
    assert roofline.program_flops(program) == 2 * (2 * b * h * n * n * d)


def test_pointwise_work_is_not_counted() -> None:
    program = export_module(nn.Sequential(nn.ReLU(), nn.Tanh()).eval(), (torch.randn(64, 64),))
    assert roofline.program_flops(program) == 0


def test_the_peak_is_a_rate_this_process_reached() -> None:
    peak = roofline.gemm_peak_flops(sizes=(128,), repeats=3)
    assert 1e8 < peak < 1e14


def test_floors_replace_the_counted_flops() -> None:
    rows = [{"model": "a", "flops": 4e8}, {"model": "dynamic"}]
    roofline.add_floors(rows, peak_flops=2e11)
    assert rows[0] == {
        "model": "a",
        "roofline": {"gflop": 0.4, "peak_gflops": 200.0, "floor_ms": 2.0},
    }
    assert rows[1] == {"model": "dynamic"}
