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

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.profiler import record_function

from tuner.contract.training import OPTIMIZER_NAMES
from tuner.graph.copying import deep_copy
from tuner.host import failures
from tuner.host.torch_compat import pytree
from tuner.measure.equivalence import (
    ELEMENTWISE,
    PER_TENSOR,
    ErrorFigures,
    doubled,
    error_figures,
    float64_copy,
    leaf_mismatch,
    named_mismatch,
    outputs_mismatch,
    twin_agrees,
)
from tuner.profiling.analysis import phase_range

LOSS_RULE = "sum over floating outputs of their mean (no scalar output to use as the loss)"

# Correctness runs use a real learning rate (a step must change the weights to be checked);
# timing runs use 0: the optimizer does the same arithmetic, and thousands of timed steps
# do not drift the weights into another numeric regime (denormals, overflow) mid-comparison.
OPTIMIZERS: dict[str, Callable[[list[nn.Parameter], float | None], torch.optim.Optimizer]] = {
    "sgd": lambda params, lr: torch.optim.SGD(params, lr=0.01 if lr is None else lr),
    "adamw": lambda params, lr: torch.optim.AdamW(params, lr=1e-3 if lr is None else lr),
}

Forward = Callable[..., tuple[torch.Tensor, Any]]


def loss_of(outputs: Any) -> torch.Tensor:
    """The step's loss from the program's outputs (see the module docstring)."""
    flat = [t for t in pytree.tree_flatten(outputs)[0] if isinstance(t, torch.Tensor)]
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
    return list(OPTIMIZER_NAMES)


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
    """Autograd on even inside the timer's inference_mode (`tuner.measure.timing.run_rounds`
    is called under it)."""
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

    `forward` gives (loss, outputs): eager `WithLoss(module)` by default, or the compiled
    module's (`compiled_runner`); the module's parameters are what the optimizer updates. The
    starting state is snapshot at creation, so `record` can be called on several input sets
    and each starts from the original weights.
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
            with record_function(phase_range("forward")):
                loss, out = self.forward(*inputs)
            with record_function(phase_range("backward")):
                loss.backward()
            grads = {n: p.grad for n, p in self.module.named_parameters()}
            if opt is not None:
                with record_function(phase_range("optimizer")):
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
            outputs=[detach(v) for v in pytree.tree_flatten(out)[0]],
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
    return TrainRunner(deep_copy(module), optimizer, device=device)


def compiled_runner(
    module: nn.Module, optimizer: str | None, device: torch.device | None = None
) -> TrainRunner:
    """torch.compile of the module (AOTAutograd compiles its backward with inductor); the
    loss (a mean) and the optimizer step stay eager, as most training loops run them.

    Compiled with inductor's `fallback_random` (a per-compile option, nothing global): random
    ops such as dropout then draw what eager draws under the same seed, so the compiled step
    can be checked against the original's. Inductor's own RNG, possibly faster, is not timed.
    The module itself is compiled, not a loss wrapper: each module has its own forward code
    and so its own compile cache entry, where one shared wrapper's would fill dynamo's limit.
    """
    own = deep_copy(module)
    compiled = torch.compile(own, options={"fallback_random": True})

    def forward(*inputs: Any) -> tuple[torch.Tensor, Any]:
        out = compiled(*inputs)
        return loss_of(out), out

    return TrainRunner(own, optimizer, forward, device=device)


RUNNERS: dict[str, Callable[[nn.Module, str | None, torch.device | None], TrainRunner]] = {
    "eager": eager_runner,
    "compile": compiled_runner,
}


def _float64_runner(module: nn.Module, optimizer: str | None) -> TrainRunner | None:
    twin = float64_copy(module)
    return None if twin is None else TrainRunner(twin, optimizer)


# The state a step leaves, as a reason names it; all of it is checked `PER_TENSOR`.
STATE_LABELS = {
    "grads": "gradient of",
    "params": "after the step,",
    "buffers": "buffer",
}


def step_mismatch(
    first: StepRecord, again: StepRecord, truth: StepRecord | None, got: StepRecord
) -> str | None:
    """Why `got` differs from the reference step `first`, or None, by the rule of
    `tuner.measure.equivalence`: the reference run twice (`again`) and in float64 (`truth`,
    where it runs and agrees); outputs and the loss `ELEMENTWISE`, gradients, parameters and
    buffers `PER_TENSOR`. A parameter missing or without a gradient where the reference has one
    is a mismatch: the candidate no longer trains that parameter.
    """
    t = truth
    reason = outputs_mismatch(first.outputs, again.outputs, t.outputs if t else None, got.outputs)
    if reason is not None:
        return reason
    reason = leaf_mismatch(first.loss, again.loss, t.loss if t else None, got.loss, ELEMENTWISE)
    if reason is not None:
        return f"loss: {reason}"
    for kind, label in STATE_LABELS.items():
        exact = getattr(t, kind) if t else None
        mine = getattr(got, kind)
        reason = named_mismatch(
            label, getattr(first, kind), getattr(again, kind), exact, mine, PER_TENSOR
        )
        if reason is not None:
            return reason
    return None


class ReferenceSteps:
    """The original's steps on fixed input sets, recorded once and checked against many
    candidates: twice each (its spread) and in float64 where that runs and agrees."""

    def __init__(
        self, module: nn.Module, optimizer: str | None, inputs_list: list[tuple], seed: int = 0
    ) -> None:
        self.module = module
        self.optimizer = optimizer
        self.inputs_list = inputs_list
        self.seed = seed
        self._records: list[tuple[StepRecord, StepRecord, StepRecord | None]] = []
        # The largest absolute and relative output errors of the candidates checked so far.
        self.output_errors = ErrorFigures()

    def _record(self, i: int) -> tuple[StepRecord, StepRecord, StepRecord | None]:
        if not self._records:
            ref = TrainRunner(deep_copy(self.module), self.optimizer)
            twin = _float64_runner(self.module, self.optimizer)
            for j, inputs in enumerate(self.inputs_list):
                first = ref.record(inputs, self.seed + j)
                again = ref.record(inputs, self.seed + j)
                truth = None
                if twin is not None:
                    try:
                        truth = twin.record(doubled(inputs), self.seed + j)
                    except Exception as exc:
                        failures.fallback(exc, "the reference step in float64", failures.anything)
                        twin = None
                    if truth is not None and not twin_agrees(first.loss, truth.loss):
                        truth = None
                self._records.append((first, again, truth))
        return self._records[i]

    def check(
        self, candidate: TrainRunner, pack: Callable[[tuple], tuple] = lambda a: a
    ) -> str | None:
        """None when `candidate`'s step matches on every input set: outputs, loss, every
        parameter's gradient and (with an optimizer) the parameters and buffers after one
        step; else the first difference. The candidate is left in its starting state."""
        for i, inputs in enumerate(self.inputs_list):
            first, again, truth = self._record(i)
            try:
                got = candidate.record(pack(inputs), self.seed + i)
            except Exception as exc:
                reason = failures.fallback(exc, "a step check: the candidate's step").reason
                return f"input set {i}: the candidate's step raised {reason}"
            self.output_errors = self.output_errors.worst(error_figures(first.outputs, got.outputs))
            reason = step_mismatch(first, again, truth, got)
            if reason is not None:
                return f"input set {i}, {reason}"
        return None


def check_training(
    reference: nn.Module,
    candidate: TrainRunner,
    inputs_list: list[tuple],
    optimizer: str | None,
    pack: Callable[[tuple], tuple] = lambda a: a,
    seed: int = 0,
) -> str | None:
    """`ReferenceSteps.check` for one candidate."""
    return ReferenceSteps(reference, optimizer, inputs_list, seed).check(candidate, pack)


# ---------------------------------------------------------------- a site's forward + backward
#
# A site of a training step (`tuner.search.extract`) gets gradients on its outputs from the rest of
# the step and sends gradients back to its inputs and parameters. Its run is therefore forward, then
# backward of sum_i <output_i, g_i> with fixed random g_i (given to autograd as grad_outputs:
# what the later layers would send back, dense as theirs are, and no loss op to time), to each
# input that carries a gradient in the step and to each parameter. The optimizer step is not
# part of it: training-safe passes keep the original parameters, so it costs the same.

Pack = Callable[[tuple], tuple]


def wants_grad(inputs: tuple) -> list[bool]:
    """Which inputs carry a gradient (as `tuner.search.extract.record_values(grad=True)` does)."""
    return [isinstance(v, torch.Tensor) and v.requires_grad for v in inputs]


def _leaves(inputs: tuple, wanted: list[bool]) -> tuple:
    return tuple(
        v.detach().requires_grad_(w) if isinstance(v, torch.Tensor) else v
        for v, w in zip(inputs, wanted, strict=True)
    )


def _carried(outputs: Any) -> list[torch.Tensor]:
    return [
        t
        for t in pytree.tree_flatten(outputs)[0]
        if isinstance(t, torch.Tensor) and t.requires_grad
    ]


def _upstream(carried: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """Drawn in float64 then cast, so a float64 twin gets the same values, only unrounded."""
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype).to(t.device)
        for t in carried
    ]


def _backward(
    carried: list[torch.Tensor], upstream: list[torch.Tensor], wrt: list[torch.Tensor]
) -> list[torch.Tensor | None]:
    if not carried or not wrt:
        return [None] * len(wrt)
    return list(torch.autograd.grad(carried, wrt, upstream, allow_unused=True))


def _input_names(module: nn.Module, count: int) -> list[str]:
    graph = getattr(module, "graph", None)
    names = [n.name for n in graph.nodes if n.op == "placeholder"] if graph is not None else []
    return names if len(names) == count else [str(i) for i in range(count)]


def _site_record(
    module: nn.Module, inputs: tuple, wanted: list[bool], names: list[str], pack: Pack, seed: int
) -> StepRecord:
    """One forward + backward of a site on `inputs` (the reference's signature), random ops
    and the upstream gradients seeded; gradients are keyed "input NAME" and by parameter."""
    leaves = _leaves(inputs, wanted)
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    grad_inputs = [(f"input {n}", v) for n, v, w in zip(names, leaves, wanted, strict=True) if w]
    wrt = [*grad_inputs, *params]
    devices = _cuda_devices([*leaves, *(p for _, p in params)])
    with _grad_on(), torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        out = module(*pack(leaves))
        carried = _carried(out)
        upstream = _upstream(carried, seed)
        grads = _backward(carried, upstream, [t for _, t in wrt])
    loss = torch.zeros((), dtype=carried[0].dtype if carried else torch.float32)
    for t, g in zip(carried, upstream, strict=True):
        loss = loss + (t.detach() * g).sum()
    detach = lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
    return StepRecord(
        outputs=[detach(v) for v in pytree.tree_flatten(out)[0]],
        loss=loss,
        grads={
            name: None if g is None else g.detach().clone()
            for (name, _), g in zip(wrt, grads, strict=True)
        },
        params={},
        buffers={},
    )


def _cuda_devices(tensors: list[Any]) -> list[torch.device]:
    found = {t.device for t in tensors if isinstance(t, torch.Tensor) and t.device.type == "cuda"}
    return sorted(found, key=str)


def check_site_step(
    reference: nn.Module,
    candidate: nn.Module,
    trials: list[tuple],
    wanted: list[bool],
    pack: Pack = lambda a: a,
    seed: int = 0,
) -> str | None:
    """None when `candidate` (called on `pack`ed inputs) gives the site's outputs and every
    gradient (to each input in `wanted`, to each of the reference's parameters) as the
    reference does on every input set; else the first difference. The tolerances are the
    training step's (`step_mismatch`): the reference run twice and, where it runs and agrees,
    in float64. A forward-identical rewrite that changes a gradient fails here, before timing.
    """
    names = _input_names(reference, len(wanted))
    twin = float64_copy(reference)
    for i, inputs in enumerate(trials):
        first = _site_record(reference, inputs, wanted, names, lambda a: a, seed + i)
        again = _site_record(reference, inputs, wanted, names, lambda a: a, seed + i)
        truth = None
        if twin is not None:
            try:
                truth = _site_record(twin, doubled(inputs), wanted, names, lambda a: a, seed + i)
            except Exception as exc:
                failures.fallback(exc, "the reference site in float64", failures.anything)
                twin = None
            if truth is not None and not twin_agrees(first.loss, truth.loss):
                truth = None
        try:
            got = _site_record(candidate, inputs, wanted, names, pack, seed + i)
        except Exception as exc:
            reason = failures.fallback(exc, "a site step check: the candidate's run").reason
            return f"input set {i}: the candidate raised {reason}"
        reason = step_mismatch(first, again, truth, got)
        if reason is not None:
            return f"input set {i}, {reason}"
    return None


def site_step(module: nn.Module, inputs: tuple, seed: int = 0) -> Callable[[], Any]:
    """The timed call: one forward + backward of `module` on `inputs`, backward to each input
    that carries a gradient (`wants_grad`) and to every parameter. The upstream gradients are
    drawn once, here, so a timed call spends nothing on them."""
    wanted = wants_grad(inputs)
    params = [p for p in module.parameters() if p.requires_grad]
    with _grad_on():
        upstream = _upstream(_carried(module(*_leaves(inputs, wanted))), seed)

    def step() -> Any:
        with _grad_on():
            leaves = _leaves(inputs, wanted)
            out = module(*leaves)
            grad_inputs = [v for v, w in zip(leaves, wanted, strict=True) if w]
            _backward(_carried(out), upstream, [*grad_inputs, *params])
        return out

    return step
