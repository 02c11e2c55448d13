"""Whether a candidate computes what the reference computes: one tolerance rule for inference
outputs, training steps and ranks, and one set of error figures for the verification record.

The rule, for each value the reference produces (an output, the loss, a gradient, a parameter or
buffer after an optimizer step) and the candidate's value in its place:

1. Structure. A non-tensor must be equal. A tensor must have the reference's shape and dtype. An
   integer or bool tensor must be equal wherever the reference is deterministic (its two runs
   agree). Where the reference is nan/inf in both runs alike, the candidate must be the same
   nan/inf; it may have none where the reference is finite.
2. Truth. Floating values are compared against t, the result of the reference's float64 twin
   (`float64_copy`: the same module in float64, on the same inputs in float64) where the twin
   runs, else the reference's own result r. A training step's twin is trusted only when its
   loss agrees with float32's (`twin_agrees`): a random op may draw differently by dtype, and a
   twin on another random path would inflate every allowance below.
3. Noise allowance. The reference run twice (r, r') shows its own error: its distance from the
   truth plus its spread (nondeterministic kernels). In a norm N chosen by what the value is,
       N(c - t)  <=  K * (N(r - t) + N(r - r'))  +  R * |t|  +  A * max|t|
   K is how many times the reference's own error another legal order may add; R and A are floors,
   relative to each value and to the tensor's largest magnitude, for values the reference
   happens to compute exactly (a copy, a sum that is exact in float32). Both floors are relative,
   so a tensor is judged at its own scale: probabilities of 1e-6 are not compared at 1e-5.
   - `ELEMENTWISE`, for outputs and losses: N is the largest absolute difference and the check
     holds at every element (|t| per element); K=3, R=1e-4, A=1e-5. An output is what a user
     reads, so every element must hold.
   - `PER_TENSOR`, for gradients and the parameters and buffers after a step: N is the
     root-mean-square over the tensor and |t| its RMS; K=10, R=1e-3, A=0. These come out of
     reductions over the whole batch and errors carried back through every later layer, and a
     fused or compiled backward sums in another order: torch.compile put a batch-norm weight's
     gradient 3e-4 of its RMS from float64 where eager was 3e-6, which no elementwise rule at
     K=3 accepts. A rewrite that changes a gradient (scales it, drops a path, misses one row in
     a thousand) is off by 3 % of the tensor or more, beyond either term.
4. Ranks: each rank compares its own outputs by `ELEMENTWISE` without a float64 twin (every
   rank must run the same collectives, and a twin failing on one rank would leave the others
   waiting in its collective), then the ranks' verdicts are all-reduced so that all agree.

The error figures (`error_figures`) are for the record, not for the verdict: the largest
absolute difference, and that relative to the reference's largest magnitude.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from tuner.graph.copying import deep_copy
from tuner.host import failures
from tuner.host.torch_compat import pytree
from tuner.measure.inputs import cloned, distinct_inputs, same_inputs

# The float64 twin is skipped above this size (it needs twice the memory of float32).
MAX_FLOAT64_BYTES = 2 << 30
# A training step's twin counts as the truth only when its loss is this close (relative).
TWIN_AGREEMENT = 1e-3


@dataclass(frozen=True)
class Tolerance:
    """One norm of the rule in the module docstring, with its K, R and A."""

    per_tensor: bool
    noise_factor: float
    rtol: float
    atol: float


ELEMENTWISE = Tolerance(per_tensor=False, noise_factor=3.0, rtol=1e-4, atol=1e-5)
PER_TENSOR = Tolerance(per_tensor=True, noise_factor=10.0, rtol=1e-3, atol=0.0)


# ---------------------------------------------------------------------------- the truth


def float64_copy(module: Any) -> torch.nn.Module | None:
    """`module` in float64 (a copy; its parameters keep requires_grad), when it is a module
    small enough to copy; else None."""
    if not isinstance(module, torch.nn.Module):
        return None
    size = sum(t.numel() * 8 for t in [*module.parameters(), *module.buffers()])
    if size > MAX_FLOAT64_BYTES:
        return None
    try:
        with torch.no_grad():
            return deep_copy(module).double()
    except Exception as exc:
        failures.fallback(exc, "a float64 copy of the reference", failures.anything)
        return None


def doubled(inputs: tuple) -> tuple:
    """The inputs with floating tensors in float64, for a float64 twin."""
    return pytree.tree_map(
        lambda v: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v,
        inputs,
    )


def float64_twin(reference: Callable[..., Any]) -> Callable[..., Any] | None:
    """The reference run in float64 on float64 inputs, where `float64_copy` can make one."""
    twin = float64_copy(reference)
    if twin is None:
        return None
    return lambda *inputs: twin(*doubled(inputs))


def twin_agrees(value: torch.Tensor, twin_value: torch.Tensor) -> bool:
    """Whether a twin's scalar (a step's loss) is within TWIN_AGREEMENT of the reference's."""
    a, b = float(value), float(twin_value)
    return math.isfinite(b) and abs(a - b) <= TWIN_AGREEMENT * max(abs(a), 1e-6)


# ---------------------------------------------------------------------------- the rule


def leaf_mismatch(
    ref: Any, ref_again: Any, truth: Any, got: Any, tolerance: Tolerance = ELEMENTWISE
) -> str | None:
    """Why `got` differs from `ref` beyond the reference's own error (`ref_again`: a second
    run; `truth`: the float64 twin's result or None), by the rule in the module docstring."""
    if not isinstance(ref, torch.Tensor):
        if isinstance(got, torch.Tensor):
            return f"got a tensor, expected {ref!r}"
        return None if got == ref else f"got {got!r}, expected {ref!r}"
    if not isinstance(got, torch.Tensor):
        return f"got {type(got).__name__}, expected a tensor"
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return f"got {got.dtype}{list(got.shape)}, expected {ref.dtype}{list(ref.shape)}"
    got = got.to(ref.device)
    if not (ref.is_floating_point() or ref.is_complex()):
        differ = (got != ref) & (ref == ref_again)
        return f"{int(differ.sum())} of {ref.numel()} elements differ" if differ.any() else None
    return _float_mismatch(ref, ref_again, truth, got, tolerance)


def _as_float64(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return torch.view_as_real(t.to(torch.complex128)) if t.is_complex() else t.to(torch.float64)


def _rms(t: torch.Tensor) -> torch.Tensor:
    return t.pow(2).mean().sqrt() if t.numel() else torch.zeros((), dtype=t.dtype)


def _norm(d: torch.Tensor, finite: torch.Tensor, tolerance: Tolerance) -> torch.Tensor:
    """N of the rule over the finite elements: RMS per tensor, else the largest magnitude."""
    return _rms(d[finite]) if tolerance.per_tensor else d.abs()[finite].max()


def _float_mismatch(
    ref: torch.Tensor,
    ref_again: torch.Tensor,
    truth: Any,
    got: torch.Tensor,
    tol: Tolerance,
) -> str | None:
    r1, r2, c = (_as_float64(t) for t in (ref, ref_again, got))
    usable = isinstance(truth, torch.Tensor) and truth.shape == ref.shape
    t = _as_float64(truth.to(ref.device)) if usable else r1
    finite = torch.isfinite(r1) & torch.isfinite(r2) & torch.isfinite(t)
    special = ~finite & (r1.isnan() == r2.isnan()) & ((r1 == r2) | r1.isnan())
    bad_special = special & ~((c == r1) | (c.isnan() & r1.isnan()))
    if bad_special.any():
        return f"{int(bad_special.sum())} nan/inf elements differ from the reference"
    if not finite.any():
        return None
    stray = finite & ~torch.isfinite(c)
    if stray.any():
        return f"{int(stray.sum())} nan/inf elements where the reference is finite"
    noise = _norm(r1 - t, finite, tol) + _norm(r1 - r2, finite, tol)
    size = _rms(t[finite]) if tol.per_tensor else t.abs()
    allowed = tol.noise_factor * noise + tol.rtol * size + tol.atol * t.abs()[finite].max()
    if tol.per_tensor:
        error = _rms((c - t)[finite])
        if error <= allowed:
            return None
        return (
            f"RMS error {float(error):.3g} > allowed {float(allowed):.3g} (the reference's own "
            f"{float(noise):.3g}; tensor RMS {float(size):.3g})"
        )
    error = (c - t).abs()
    excess = torch.where(finite, error - allowed, torch.full_like(error, -math.inf)).flatten()
    worst = int(excess.argmax())
    if excess[worst] <= 0:
        return None
    return (
        f"max error {float(error.flatten()[worst]):.3g} > allowed "
        f"{float(allowed.flatten()[worst]):.3g} at flat index {worst} "
        f"(got {c.flatten()[worst].item():.6g}, expected {t.flatten()[worst].item():.6g}); "
        f"{int((excess > 0).sum())} of {ref.numel()} elements out of tolerance"
    )


def outputs_mismatch(
    first: Sequence[Any],
    again: Sequence[Any],
    truth: Sequence[Any] | None,
    got: Sequence[Any],
    tolerance: Tolerance = ELEMENTWISE,
) -> str | None:
    """The first output (flattened) of `got` that `leaf_mismatch` rejects, or None."""
    if len(got) != len(first):
        return f"{len(got)} outputs, expected {len(first)}"
    exact = truth if truth is not None and len(truth) == len(first) else None
    for j, (r1, r2, c) in enumerate(zip(first, again, got, strict=True)):
        reason = leaf_mismatch(r1, r2, None if exact is None else exact[j], c, tolerance)
        if reason is not None:
            return f"output {j}: {reason}"
    return None


def named_mismatch(
    label: str,
    first: Mapping[str, Any],
    again: Mapping[str, Any],
    truth: Mapping[str, Any] | None,
    got: Mapping[str, Any],
    tolerance: Tolerance,
) -> str | None:
    """The first named value (a gradient, a parameter) that `got` lacks or `leaf_mismatch`
    rejects; a value the reference has and the candidate lacks is a mismatch."""
    for name, r1 in first.items():
        if name not in got:
            return f"{label} {name}: missing from the candidate"
        if r1 is None:
            continue
        c = got[name]
        if c is None:
            return f"{label} {name}: the candidate has none"
        exact = truth.get(name) if truth else None
        reason = leaf_mismatch(r1, again[name], exact, c, tolerance)
        if reason is not None:
            return f"{label} {name}: {reason}"
    return None


def _leaves(out: Any) -> list[Any]:
    return pytree.tree_flatten(out)[0]


Expected = tuple[list[Any], list[Any], list[Any] | None]  # first run, second run, float64


class ReferenceMemo:
    """The reference's outputs per distinct input set (run twice, and in float64 where it can
    be), computed once and kept for as long as the memo: a tuning run keeps one for the
    original, so its checks of candidates, its verification, its size buckets and their
    dispatching program share one reference (one float64 twin, built on first use)."""

    def __init__(self, reference: Callable[..., Any]) -> None:
        self.reference = reference
        self._twin: Callable[..., Any] | None = None
        self._twin_tried = False  # the twin is built once, on the first input set
        self._seen: list[tuple[tuple, Expected, float]] = []  # with the second run's seconds

    def _made(self, inputs: tuple) -> tuple[Expected, float] | None:
        """The outputs made on `inputs` and the second run's seconds, or None."""
        return next(((e, s) for seen, e, s in self._seen if same_inputs(seen, inputs)), None)

    def knows(self, inputs: tuple) -> bool:
        """Whether the reference's outputs on `inputs` are made already (a check there costs
        the candidate's call only)."""
        return self._made(inputs) is not None

    def call_s(self, inputs: tuple) -> float | None:
        """The reference's wall seconds on `inputs` in its second run (warm: the first ran
        just before), once its outputs there are made: a call's time that costs no calls."""
        made = self._made(inputs)
        return None if made is None else made[1]

    def expected(self, inputs: tuple) -> Expected:
        made = self._made(inputs)
        if made is not None:
            return made[0]
        first = _leaves(self.reference(*cloned(inputs)))
        again = cloned(inputs)
        began = time.perf_counter()
        second = _leaves(self.reference(*again))
        second_s = time.perf_counter() - began
        exact: list[Any] | None = None
        twin = self._float64()
        if twin is not None:
            try:
                exact = _leaves(twin(*cloned(inputs)))
            except Exception as exc:
                failures.fallback(exc, "the reference in float64", failures.anything)
                self._twin = None
        self._seen.append((inputs, (first, second, exact), second_s))
        return first, second, exact

    def _float64(self) -> Callable[..., Any] | None:
        if not self._twin_tried:
            self._twin_tried = True
            with torch.inference_mode(False):  # the twin's parameters: not inference tensors
                self._twin = float64_twin(self.reference)
        return self._twin


class ReferenceOutputs:
    """The reference's outputs on each input set, run twice (its own run-to-run spread) and in
    float64 where it can be, computed once; then any number of candidates are checked against
    them (the rule in the module docstring, `ELEMENTWISE`).

    A tuning run checks many candidates against one original on the same input sets; computing
    the reference again for each (twice, plus a float64 twin several times slower) made the
    check cost more than the candidate: a whole-model check of EfficientNet-B0 took 65 s with
    other work on the cores. Each input set's figures are computed the first time a candidate
    gets that far, so a candidate failing on the first set costs no more than before. An input
    set equal to an earlier one is checked once (`distinct_inputs`); with a `memo` for the same
    reference, input sets it has seen cost no reference run at all.
    """

    def __init__(
        self,
        reference: Callable[..., Any],
        inputs_list: Sequence[tuple],
        memo: ReferenceMemo | None = None,
    ) -> None:
        self.reference = reference
        self.trials = distinct_inputs(list(inputs_list))
        own = memo is not None and memo.reference is reference
        self.memo = memo if own else ReferenceMemo(reference)

    def _at(self, i: int) -> Expected:
        return self.memo.expected(self.trials[i])

    def check(self, candidate: Callable[..., Any]) -> str | None:
        """None when the candidate's outputs match on every input set; else the first
        difference."""
        return self.check_with_errors(candidate)[0]

    def check_with_errors(self, candidate: Callable[..., Any]) -> tuple[str | None, ErrorFigures]:
        """`check`, and the error figures of the candidate's outputs against the reference's
        first run on the input sets it ran (`error_figures`): one run of the candidate for
        both."""
        worst = ErrorFigures()
        for i, inputs in enumerate(self.trials):
            with torch.inference_mode():
                first, second, exact = self._at(i)
            args = _as_a_caller_makes(inputs)
            try:
                with torch.inference_mode():
                    got = _leaves(candidate(*args))
            except Exception as exc:
                reason = failures.fallback(exc, "an output check: the candidate's run").reason
                return f"input set {i}: the candidate raised {reason}", worst
            worst = worst.worst(error_figures(first, got))
            reason = outputs_mismatch(first, second, exact, got)
            if reason is not None:
                return f"input set {i}, {reason}", worst
        return None, worst


def _as_a_caller_makes(inputs: tuple) -> tuple:
    """Copies of `inputs` made outside inference mode, as a caller (and the timing) passes
    them: copies made inside it are inference tensors, which fail dynamo's dispatch-key guard,
    so a torch.compile candidate compiled again for its check (15 s of recsys_dyn's 60)."""
    with torch.inference_mode(False):
        return cloned(inputs)


def check_outputs(
    reference: Callable[..., Any],
    candidate: Callable[..., Any],
    inputs_list: Sequence[tuple],
) -> str | None:
    """None when the candidate's outputs match the reference's on every input set (the rule in
    the module docstring, `ELEMENTWISE`); else the first difference."""
    return ReferenceOutputs(reference, inputs_list).check(candidate)


# ---------------------------------------------------------------------------- figures


class ErrorFigures(NamedTuple):
    """The verification record's figures: the largest absolute error, and the largest relative
    to the reference tensor's largest magnitude (floating tensors only)."""

    max_abs: float = 0.0
    max_rel: float = 0.0

    def worst(self, other: ErrorFigures) -> ErrorFigures:
        return ErrorFigures(max(self.max_abs, other.max_abs), max(self.max_rel, other.max_rel))


def error_figures(expected: Sequence[Any], got: Sequence[Any]) -> ErrorFigures:
    """The figures of flattened outputs; values that are not tensors of one shape are skipped
    (the check, not the figures, says they differ)."""
    worst = ErrorFigures()
    for e, g in zip(expected, got, strict=False):
        if not (isinstance(e, torch.Tensor) and isinstance(g, torch.Tensor)):
            continue
        if e.shape != g.shape or not e.numel():
            continue
        e64 = _as_float64(e)
        diff = float((e64 - _as_float64(g.to(e.device))).abs().max())
        rel = 0.0
        if e.is_floating_point() or e.is_complex():
            rel = diff / max(float(e64.abs().max()), 1e-12)
        worst = worst.worst(ErrorFigures(diff, rel))
    return worst


def output_errors(
    reference: Callable[..., Any], candidate: Callable[..., Any], trials: Sequence[tuple]
) -> ErrorFigures:
    """`error_figures` of the candidate's outputs against the reference's over `trials`."""
    worst = ErrorFigures()
    for inputs in trials:
        args = _as_a_caller_makes(inputs)
        with torch.inference_mode():
            expected = _leaves(reference(*cloned(inputs)))
            worst = worst.worst(error_figures(expected, _leaves(candidate(*args))))
    return worst
