"""Programs whose cost per call was unbounded before issue 47, as an attacker would upload them.

Each is a small `.pt2` (a few KB: the big tensors are a tiny input broadcast up), exported the
ordinary way except the power tower, whose expression is planted in the program JSON. fxtune
must refuse each before running it: `tests/tuner/loading/test_bounds.py`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from tests.crafted import dynamic_program, first_size_expression
from tuner.graph.capture import export_module, save_program

POWER_TOWER = "((((99999999999999999999) ** 64) ** 64) ** 64) ** 64"
SORTED_ELEMENTS = 2**27
SORTS = 64
MATRIX_SIZE = 6144


class _DataLoop(nn.Module):
    """Sorts `x` as many times as `n` sums to: the trip count is data."""

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        def cond_fn(i: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return i < n.sum()

        def body_fn(i: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, y.sort().values + 1

        start = torch.zeros((), dtype=torch.int64)
        return torch.while_loop(cond_fn, body_fn, (start, x))[1]


def while_loop_program(dst: Path) -> Path:
    inputs = (torch.randn(1024), torch.tensor([10**9, 10**9, 10**9]))
    return save_program(export_module(_DataLoop(), inputs), dst)


class _MatrixExp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.matrix_exp(x.expand(MATRIX_SIZE, MATRIX_SIZE)).sum()


def matrix_exp_program(dst: Path) -> Path:
    """One op torch's FLOP counter does not count: about 10^13 FLOPs of matmuls."""
    return save_program(export_module(_MatrixExp(), (torch.ones(1, 1),)), dst)


class _SortChain(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.expand(SORTED_ELEMENTS)
        for _ in range(SORTS):
            y = y.sort().values
        return y[:1]


def sort_chain_program(dst: Path) -> Path:
    """Sixty-four sorts of 2^27 elements: most of an hour of one core."""
    return save_program(export_module(_SortChain(), (torch.ones(1),)), dst)


def power_tower_program(dst: Path) -> Path:
    """A program whose first symbolic size is issue 47's 52-character expression."""
    src = dynamic_program(dst.with_name(dst.stem + "_src.pt2"))
    return first_size_expression(src, dst, lambda _expr: POWER_TOWER)


def cost_bombs(root: Path) -> dict[str, Path]:
    return {
        "while_loop": while_loop_program(root / "while_loop.pt2"),
        "matrix_exp": matrix_exp_program(root / "matrix_exp.pt2"),
        "sort_chain": sort_chain_program(root / "sort_chain.pt2"),
        "power_tower": power_tower_program(root / "power_tower.pt2"),
    }
