"""Inputs for checks: fresh variants of recorded inputs, and a private copy for each call."""

from __future__ import annotations

from typing import Any

import torch

from tuner.host.torch_compat import pytree


def fresh_inputs(inputs: tuple, count: int, seed: int = 0) -> list[tuple]:
    """Variants of recorded inputs: floats perturbed (same shape, dtype, strides), integers kept.

    Floats are scaled elementwise by exp(0.1 * N(0, 1)) rather than redrawn: signs, zeros,
    masks and the rough range survive (a log or sqrt of an input stays defined), yet every
    nonzero value changes. Integer and bool tensors (indices, offsets, lengths) and non-tensors
    are kept, because changing them would make the inputs invalid, not merely new.
    """
    gen = torch.Generator().manual_seed(seed)
    return [pytree.tree_map(lambda v: _perturbed(v, gen), inputs) for _ in range(count)]


def _perturbed(value: Any, gen: torch.Generator) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    if not value.is_floating_point():
        return value.clone()
    work = torch.float64 if value.dtype == torch.float64 else torch.float32
    noise = torch.randn(value.shape, generator=gen, dtype=work).to(value.device)
    out = torch.empty_like(value)
    out.copy_(value.detach().to(work) * torch.exp(0.1 * noise))
    return out


def cloned(inputs: tuple) -> tuple:
    """Each call gets its own copy, so an in-place op in one cannot change what the next sees."""
    return pytree.tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, inputs)
