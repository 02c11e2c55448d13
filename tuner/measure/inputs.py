"""Inputs for checks: fresh variants of recorded inputs, each set once, and a private copy for
each call."""

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


def distinct_inputs(trials: list[tuple]) -> list[tuple]:
    """`trials` without the input sets equal to an earlier one.

    Fresh variants of a model whose inputs are all integers (token ids and masks) are the
    recorded inputs again: checking them twice more tripled a text model's checks and found
    nothing new (verifying DistilBERT beside two busy processes took 70 s of a 300 s budget).
    """
    kept: list[tuple] = []
    for trial in trials:
        if not any(same_inputs(trial, seen) for seen in kept):
            kept.append(trial)
    return kept


def same_inputs(a: Any, b: Any) -> bool:
    """Whether two input sets are equal: the same structure, and tensors of one dtype, shape
    and device with equal values."""
    leaves_a, spec_a = pytree.tree_flatten(a)
    leaves_b, spec_b = pytree.tree_flatten(b)
    if spec_a != spec_b:
        return False
    for x, y in zip(leaves_a, leaves_b, strict=True):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if not isinstance(x, torch.Tensor):
            if x != y:
                return False
            continue
        if x.dtype != y.dtype or x.shape != y.shape or x.device != y.device:
            return False
        if not torch.equal(x, y):
            return False
    return True
