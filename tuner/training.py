"""A training step of an exported program, and checking a rewritten step against the original.

A program exported from a module in train mode keeps batch norm in its training form and dropout
live, and `program.module()` gives a GraphModule whose parameters are `nn.Parameter`s with
`requires_grad`: autograd runs through it, so one step is forward -> loss -> backward ->
(optionally) one optimizer step, all with plain torch.

The loss is the program's own: its first scalar floating output when it returns one (a model
that computes its loss), else `LOSS_RULE`, the sum over floating outputs of their means, so
that the step's backward covers every output.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from tuner.measure import leaf_mismatch

LOSS_RULE = "sum over floating outputs of their mean (no scalar output to use as the loss)"

# Correctness runs use a real learning rate (a step must change the weights to be checked);
# timing runs use 0: the optimizer does the same arithmetic, and thousands of timed steps
# do not drift the weights into another numeric regime (denormals, overflow) mid-comparison.
OPTIMIZERS: dict[str, Callable[[list[nn.Parameter], float | None], torch.optim.Optimizer]] = {
    "sgd": lambda params, lr: torch.optim.SGD(params, lr=0.01 if lr is None else lr),
    "adamw": lambda params, lr: torch.optim.AdamW(params, lr=1e-3 if lr is None else lr),
}

# The float64 twin is trusted as the exact value only when its loss agrees with the float32
# reference to this relative distance: beyond it the two took different random paths (e.g. a
# random op that draws differently by dtype) and it would inflate every tolerance.
TWIN_AGREEMENT = 1e-3
# Tolerances relative to each tensor's own largest magnitude (gradients span many scales);
# the reference's own noise (spread and distance from float64) is added on top.
RTOL = 1e-4
ATOL_SCALE = 1e-5

Forward = Callable[..., tuple[torch.Tensor, Any]]


def loss_of(outputs: Any) -> torch.Tensor:
    """The step's loss from the program's outputs (see the module docstring)."""
    flat = [t for t in tree_flatten(outputs)[0] if isinstance(t, torch.Tensor)]
    floats = [t for t in flat if t.is_floating_point()]
    for t in floats:
        if t.dim() == 0:
            return t
    if not floats:
        raise ValueError("the program has no floating output to train on")
    total = floats[0].mean()
    for t in floats[1:]:
        total = total + t.mean()
    return total


class WithLoss(nn.Module):
    """The module and its loss in one forward, so torch.compile traces (and AOTAutograd
    differentiates) the loss with the model."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *inputs: Any) -> tuple[torch.Tensor, Any]:
        out = self.module(*inputs)
        return loss_of(out), out


def optimizer_names() -> list[str]:
    return sorted(OPTIMIZERS)


def make_optimizer(
    name: str | None, params: list[nn.Parameter], lr: float | None = None
) -> torch.optim.Optimizer | None:
    if name is None:
        return None
    try:
        return OPTIMIZERS[name](params, lr)
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}") from None


@contextmanager
def _grad_on() -> Iterator[None]:
    """Autograd on even inside the timer's inference_mode (tuner.measure.compare)."""
    with torch.inference_mode(False), torch.enable_grad():
        yield


@dataclass
class StepRecord:
    """What one step produced: outputs, loss, each parameter's gradient, the state after."""

    outputs: list[Any]
    loss: torch.Tensor
    grads: dict[str, torch.Tensor | None]
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]


@dataclass
class TrainRunner:
    """A module trained one step at a time, from the same starting state each time it records.

    `forward` is how it runs (eager `WithLoss(module)`, or its torch.compile); the module's
    parameters are what the optimizer updates. The starting state is snapshot at creation, so
    `record` can be called on several input sets and each starts from the original weights.
    """

    module: nn.Module
    optimizer: str | None = None
    forward: Forward | None = None
    device: torch.device | None = None
    initial: dict[str, torch.Tensor] = field(init=False)
    _timed_opt: torch.optim.Optimizer | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.forward is None:
            self.forward = WithLoss(self.module)
        self.initial = {k: v.detach().clone() for k, v in self._state().items()}

    def _state(self) -> dict[str, torch.Tensor]:
        return {**dict(self.module.named_parameters()), **dict(self.module.named_buffers())}

    def _params(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def reset(self) -> None:
        with torch.no_grad():
            for name, t in self._state().items():
                t.copy_(self.initial[name])
        self.module.zero_grad(set_to_none=True)

    def _run(self, inputs: tuple, opt: torch.optim.Optimizer | None) -> tuple[torch.Tensor, Any]:
        assert self.forward is not None
        with _grad_on():
            if opt is not None:
                opt.zero_grad(set_to_none=True)
            else:
                self.module.zero_grad(set_to_none=True)
            loss, out = self.forward(*inputs)
            loss.backward()
            grads = {n: p.grad for n, p in self.module.named_parameters()}
            if opt is not None:
                opt.step()
        return loss, (out, grads)

    def record(self, inputs: tuple, seed: int) -> StepRecord:
        """One step from the starting state, random ops seeded (the global RNG is restored)."""
        self.reset()
        opt = make_optimizer(self.optimizer, self._params())
        devices = [self.device] if self.device is not None and self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            loss, (out, grads) = self._run(inputs, opt)
        detach = lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
        record = StepRecord(
            outputs=[detach(v) for v in tree_flatten(out)[0]],
            loss=loss.detach().clone(),
            grads={n: None if g is None else g.detach().clone() for n, g in grads.items()},
            params={n: p.detach().clone() for n, p in self.module.named_parameters()},
            buffers={n: b.detach().clone() for n, b in self.module.named_buffers()},
        )
        self.reset()
        return record

    def step(self, *inputs: Any) -> Any:
        """One timed step: the optimizer (if any) at learning rate 0, created once."""
        if self.optimizer is not None and self._timed_opt is None:
            self._timed_opt = make_optimizer(self.optimizer, self._params(), lr=0.0)
        loss, _ = self._run(inputs, self._timed_opt)
        return loss


def eager_runner(
    module: nn.Module, optimizer: str | None, device: torch.device | None = None
) -> TrainRunner:
    """A runner on a private copy (recording and timing never touch `module`)."""
    return TrainRunner(copy.deepcopy(module), optimizer, device=device)


def compiled_runner(
    module: nn.Module, optimizer: str | None, device: torch.device | None = None
) -> TrainRunner:
    """torch.compile of forward + loss (AOTAutograd compiles the backward with inductor);
    the optimizer step stays eager, as most training loops run it."""
    own = copy.deepcopy(module)
    return TrainRunner(own, optimizer, torch.compile(WithLoss(own)), device=device)


RUNNERS: dict[str, Callable[[nn.Module, str | None, torch.device | None], TrainRunner]] = {
    "eager": eager_runner,
    "compile": compiled_runner,
}


def _doubled(inputs: tuple) -> tuple:
    return tree_map(
        lambda v: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v,
        inputs,
    )


def _float64_runner(module: nn.Module, optimizer: str | None) -> TrainRunner | None:
    try:
        twin = copy.deepcopy(module).double()
    except Exception:
        return None
    return TrainRunner(twin, optimizer)


def _compare(what: str, ref: Any, again: Any, truth: Any, got: Any) -> str | None:
    """`tuner.measure.leaf_mismatch` with an absolute tolerance scaled to the tensor itself."""
    atol = 0.0
    if isinstance(ref, torch.Tensor) and ref.is_floating_point() and ref.numel():
        scale = float(ref.detach().double().abs().max())
        atol = ATOL_SCALE * scale if math.isfinite(scale) else 0.0
    reason = leaf_mismatch(ref, again, truth, got, RTOL, atol)
    return None if reason is None else f"{what}: {reason}"


def step_mismatch(
    first: StepRecord, again: StepRecord, truth: StepRecord | None, got: StepRecord
) -> str | None:
    """Why `got` differs from the reference step `first`, or None.

    Tolerances follow `tuner.measure.check_outputs`: each tensor may differ by the reference's
    own noise (its spread between two identical runs plus its distance from float64) times
    NOISE_FACTOR, plus a small relative term. A parameter missing or without a gradient where
    the reference has one is a mismatch: the candidate no longer trains that parameter.
    """
    if len(got.outputs) != len(first.outputs):
        return f"{len(got.outputs)} outputs, expected {len(first.outputs)}"
    t = truth
    for j, (r1, r2, c) in enumerate(zip(first.outputs, again.outputs, got.outputs, strict=True)):
        reason = _compare(f"output {j}", r1, r2, t.outputs[j] if t else None, c)
        if reason:
            return reason
    reason = _compare("loss", first.loss, again.loss, t.loss if t else None, got.loss)
    if reason:
        return reason
    for kind in ("grads", "params", "buffers"):
        ref, ref2, exact = getattr(first, kind), getattr(again, kind), getattr(t, kind, None)
        mine = getattr(got, kind)
        for name, r1 in ref.items():
            label = {"grads": "gradient of", "params": "after the step,", "buffers": "buffer"}[kind]
            if name not in mine:
                return f"{label} {name}: missing from the candidate"
            if r1 is None:
                continue
            c = mine[name]
            if c is None:
                return f"{label} {name}: the candidate has none"
            exact_v = exact.get(name) if exact else None
            reason = _compare(f"{label} {name}", r1, ref2[name], exact_v, c)
            if reason:
                return reason
    return None


def _twin_agrees(first: StepRecord, twin: StepRecord) -> bool:
    a, b = float(first.loss), float(twin.loss)
    return math.isfinite(b) and abs(a - b) <= TWIN_AGREEMENT * max(abs(a), 1e-6)


def check_training(
    reference: nn.Module,
    candidate: TrainRunner,
    inputs_list: list[tuple],
    optimizer: str | None,
    pack: Callable[[tuple], tuple] = lambda a: a,
    seed: int = 0,
) -> str | None:
    """None when `candidate`'s training step matches `reference`'s on every input set: outputs,
    loss, every parameter's gradient and (with an optimizer) the parameters and buffers after
    one step; else the first difference. The candidate is reset to its starting state after."""
    ref = TrainRunner(copy.deepcopy(reference), optimizer)
    twin = _float64_runner(reference, optimizer)
    for i, inputs in enumerate(inputs_list):
        first = ref.record(inputs, seed + i)
        again = ref.record(inputs, seed + i)
        truth = None
        if twin is not None:
            try:
                truth = twin.record(_doubled(inputs), seed + i)
            except Exception:
                twin = None
            if truth is not None and not _twin_agrees(first, truth):
                truth = None
        try:
            got = candidate.record(pack(inputs), seed + i)
        except Exception as exc:
            return f"input set {i}: the candidate's step raised {type(exc).__name__}: {exc}"
        reason = step_mismatch(first, again, truth, got)
        if reason is not None:
            return f"input set {i}, {reason}"
    return None
