"""Tuning a training step: the step kind of `--mode train` (`tuner.tuning.step_kind.StepKind`).

What is timed is one step (forward, loss, backward, and the optimizer step when one is asked
for) of each whole-model candidate, interleaved with the original's step, with the same
`tuner.measure.timing.compare`, summary and "never worse" choice as inference. Before any timing a
candidate's step is checked (`tuner.training.step.ReferenceSteps`): outputs, loss, every
parameter's gradient and the state after the optimizer step must match the original's on
several input sets, or it is rejected as "wrong outputs" without being timed.

Differences from inference, each for a reason:
- Only `train_safe` passes run, and they keep the original parameters as the trainable
  leaves (fused weights are stacked inside the step), so the tuned module keeps the
  original's state_dict and an optimizer over its parameters trains it.
- Backends: eager and torch.compile (AOTAutograd + inductor) of forward + loss. AOTInductor
  packages are inference-only (no backward), so "inductor" is never a training candidate.
- Per-site search times each site's forward and backward
  (`tuner.search.site_search.FORWARD_BACKWARD`): a site's forward time says little about its
  backward. The extracted site is differentiated to its parameters and to the inputs that carry
  a gradient in the step, and a rewrite must keep every one of those gradients (checked before
  timing, else "wrong outputs"). The sites faster beyond noise make one more whole-model
  candidate ("winning sites") beside every training-safe pass and each pass that fires on its
  own; as in inference, the whole step's check and timing decide what ships, so a site that
  wins alone but not in the step is not kept.
- Tuned at the example's size only (the sizes of a dynamic program are not swept).
- The shipped step is also timed against torch.compile of the original's step (the peer a user
  would otherwise run): `versus_compile` in the config's tuning section.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import fx
from torch.export import ExportedProgram

from tuner.backends import registry as backends
from tuner.contract.config import (
    Figures,
    Mode,
    PassStep,
    TrainingSetup,
    TunedConfig,
    Verification,
)
from tuner.contract.errors import InputError
from tuner.deploy.replay import replay_steps, steps_of
from tuner.graph.capture import Inputs, example_inputs, to_graph_module
from tuner.graph.copying import deep_copy
from tuner.graph.nodes import arg, aten
from tuner.graph.shapes import spec_of
from tuner.host import failures
from tuner.host.torch_compat import pytree
from tuner.measure.inputs import fresh_inputs
from tuner.measure.timing import compare
from tuner.measure.verdicts import timing_fields
from tuner.passes import get_pass, pass_names
from tuner.passes.apply import Transformed, apply_steps
from tuner.search.site_search import FORWARD_BACKWARD, Progress, SiteRun
from tuner.training.step import (
    LOSS_RULE,
    RUNNERS,
    ReferenceSteps,
    TrainRunner,
    eager_runner,
)
from tuner.tuning.candidates import Candidate, steps_from_sites
from tuner.tuning.run import Captured, TuningRun, Verified
from tuner.tuning.verify import reverted

# What a backend is called in the compile-time store: a compile of forward + backward costs
# more than a forward-only one, so its estimates are kept apart.
COMPILE_KEY = "compile-train"
GRAPHED = "CUDA graphs are captured for inference (no autograd history): not a training candidate"
NOT_TRAINABLE = {
    "inductor": "AOTInductor packages are inference-only (no backward): not a training candidate",
    "cudagraph": GRAPHED,
    "compile-cudagraphs": GRAPHED,
}
SEARCH_NOTE = (
    "per-site decisions time each site's forward + backward on its own (eager; the "
    "optimizer step is not in it: passes keep the parameters, so it costs the same)"
)


def eval_mode_ops(gm: fx.GraphModule) -> list[str]:
    """Nodes that show an eval-mode export: dropout off, batch norm on running statistics."""
    flags = {aten.dropout.default: (2, "train"), aten.batch_norm.default: (5, "training")}
    return [
        node.name
        for node in gm.graph.nodes
        if node.op == "call_function"
        and node.target in flags
        and arg(node, *flags[node.target]) is False
    ]


def loss_rule(gm: fx.GraphModule, inputs: Inputs) -> str:
    """Which loss the step takes: the program's scalar output, or the documented default.

    Run on a copy: a training graph's batch norms update their running statistics in place.
    """
    with torch.no_grad():
        flat = pytree.tree_flatten(deep_copy(gm)(*inputs))[0]
    for j, t in enumerate(flat):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() == 0:
            return f"the program's scalar output {j}"
    return LOSS_RULE


class TrainingStep:
    """A training step as the unit of checking and timing."""

    mode: ClassVar[Mode] = "train"
    site_run: ClassVar[SiteRun] = FORWARD_BACKWARD
    compiling: ClassVar[str] = "compiling the training step"

    def __init__(self, run: TuningRun) -> None:
        self.run = run
        self.optimizer: str | None = run.options.optimizer
        self.notes: list[str] = []
        self._baseline: TrainRunner | None = None
        self._reference: ReferenceSteps | None = None  # the original's checked steps

    def _note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    def passes(self) -> list[str]:
        asked = self.run.options.passes
        unsafe = [p for p in asked or [] if not get_pass(p).train_safe]
        if unsafe:
            raise InputError(f"not valid in a training step: {', '.join(unsafe)}")
        return [p for p in (asked or pass_names()) if get_pass(p).train_safe]

    def capture(self, program: ExportedProgram, say: Progress) -> Captured:
        say(0.0, "capturing graph (training)")
        gm0 = to_graph_module(program, train=True).to(self.run.device.torch_device)
        inputs = self.run.to_device(example_inputs(program))
        spec = spec_of(gm0)
        skipped: list[str] = []
        if spec is not None:
            skipped.append("training is tuned at the example's size only")
        frozen = eval_mode_ops(gm0)
        if frozen:
            self.notes.append(
                f"the program was exported in eval mode ({', '.join(frozen)}): its step trains "
                "with frozen batch norm statistics and no dropout; export the module after "
                "model.train() to tune the training step it really takes"
            )
        return Captured(gm0, inputs, spec, skipped)

    def _baseline_runner(self, gm0: fx.GraphModule) -> TrainRunner:
        if self._baseline is None:
            self._baseline = eager_runner(gm0, self.optimizer, self.run.device.torch_device)
        return self._baseline

    def baseline(self, gm0: fx.GraphModule) -> Callable[..., Any]:
        """The original's eager training step; its time bounds the checks, and a site's
        forward + backward cannot take longer (`tuner.search.site_search.CONSISTENCY_SLACK`)."""
        return self._baseline_runner(gm0).step

    def timed_call(self, runner: Any) -> Callable[..., Any]:
        return runner.step  # a TrainRunner: what `build` makes

    def before_search(self, say: Progress) -> None:
        say(0.3, "searching sites (forward + backward)")
        self._note(SEARCH_NOTE)

    def candidates(
        self, gm0: fx.GraphModule, inputs: Inputs, greedy: list[PassStep], every: list[str]
    ) -> list[Candidate]:
        asked = self.run.backends()
        for b in asked:
            if b in NOT_TRAINABLE:
                self._note(f"{b}: {NOT_TRAINABLE[b]}")
        return training_candidates(gm0, inputs, greedy, every, [b for b in asked if b in RUNNERS])

    def compile_estimate(self, cand: Candidate) -> float | None:
        nodes = len(cand.transformed.gm.graph.nodes)
        return self.run.compile_times.estimate(self.run.hardware_key, COMPILE_KEY, nodes)

    def build(self, cand: Candidate, left: float) -> backends.Built:
        """A training runner on a copy of the candidate's module; a compile happens on its
        first step, made (and timed, for the next estimate) here."""
        run = self.run
        t = cand.transformed
        runner = RUNNERS[cand.backend](t.gm, self.optimizer, run.device.torch_device)
        if cand.backend in backends.COMPILING:
            nodes = len(t.gm.graph.nodes)
            first = time.monotonic()
            runner.record(t.inputs, 0)
            run.compile_times.record(run.hardware_key, COMPILE_KEY, nodes, time.monotonic() - first)
        return backends.Built(runner)

    def check_trials(self, inputs: Inputs) -> list[Inputs]:
        """Each set one step, the state carried on: a set equal to an earlier one is a step of
        its own, so all are kept."""
        return [inputs, *fresh_inputs(inputs, 2)]

    def reference_call_s(self, baseline: Callable[..., Any], inputs: Inputs) -> float | None:
        return None  # its reference is steps, made once at the example's size

    def check(
        self,
        gm0: fx.GraphModule,
        inputs: Inputs,
        runner: Any,
        pack: Callable[[Inputs], Inputs],
    ) -> str | None:
        """The candidate's training step against the original's: outputs, loss, gradients and
        the state after the optimizer step."""
        if self._reference is None:
            self._reference = ReferenceSteps(gm0, self.optimizer, self.check_trials(inputs))
        return self._reference.check(runner, pack)

    def verify(
        self, program: ExportedProgram, captured: Captured, fig: Figures, chosen: Candidate
    ) -> Verified:
        """The config replayed from the original (eager) and the chosen runner must both train
        as the original does on fresh inputs; else the original ships, with the reason."""
        gm0, inputs = captured.gm, captured.inputs
        device = self.run.device.torch_device
        replay = replay_steps(program, chosen.passes, train=True)
        replay.gm.to(device)
        trials = fresh_inputs(inputs, 3, seed=1234)
        reference = ReferenceSteps(gm0, self.optimizer, trials, seed=1234)
        wrong = reference.check(eager_runner(replay.gm, self.optimizer, device), replay.pack)
        runner = chosen.runner if isinstance(chosen.runner, TrainRunner) else None
        if wrong is None and runner is not None:
            wrong = reference.check(runner, replay.pack)
        # From the checked steps (seeded alike): calling the modules here would draw other
        # dropout masks and move their batch norms' running statistics.
        abs_err, rel_err = reference.output_errors
        verification = Verification(
            inputs=len(trials),
            max_abs_error=abs_err,
            max_rel_error=rel_err,
            passed=wrong is None,
            reason=wrong,
        )
        if wrong is not None:
            reason = f"the tuned training step failed verification ({wrong}); the original stands"
            return reverted(captured, self.baseline(gm0), verification, reason)
        step = runner.step if runner is not None else eager_runner(replay.gm, self.optimizer).step
        return Verified(fig, chosen, replay, step, verification)

    def finish(self, config: TunedConfig, captured: Captured, verified: Verified) -> TunedConfig:
        """The optimizer and loss of the step, the notes, and the step against torch.compile's."""
        versus = versus_compile(self.run, captured, verified)
        tuning = {**config.tuning, "notes": self.notes, "versus_compile": versus}
        setup = TrainingSetup(
            optimizer=self.optimizer, loss=loss_rule(captured.gm, captured.inputs)
        )
        return config.model_copy(update={"training": setup, "tuning": tuning})

    @classmethod
    def profiled_baseline(
        cls, module: torch.nn.Module, config: TunedConfig, device: torch.device
    ) -> Callable[..., Any]:
        """The original's eager training step: a step is what was tuned, so a step is what is
        profiled."""
        optimizer = config.training.optimizer if config.training else None
        return eager_runner(module, optimizer, device).step


def training_candidates(
    gm0: fx.GraphModule,
    inputs: Inputs,
    greedy: list[PassStep],
    every: list[str],
    wanted: list[str],
) -> list[Candidate]:
    """The trainable peers (`wanted` but eager), then under each backend the winning sites,
    every pass, and each pass that fires on its own (under eager), each pass set once."""
    try:
        blind = apply_steps(deep_copy(gm0), inputs, [(p, None) for p in every])
    except Exception as exc:  # only the "every pass" candidates are lost
        failures.fallback(exc, "applying every pass")
        blind = Transformed(gm0, inputs)
    blind_steps = steps_from_sites(blind.applied)
    original = Transformed(gm0, inputs)
    out = [Candidate(b, b, [], original) for b in wanted if b != "eager"]
    if not blind.applied:
        return out
    seen = [blind_steps]
    if greedy and greedy not in seen:
        seen.append(greedy)
        won = apply_steps(deep_copy(gm0), inputs, steps_of(greedy))
        out += [Candidate(f"{b} + winning sites", b, greedy, won) for b in wanted]
    out += [Candidate(f"{b} + every pass", b, blind_steps, blind) for b in wanted]
    if len(blind_steps) > 1 and "eager" in wanted:
        for step in blind_steps:
            alone = apply_steps(deep_copy(gm0), inputs, [(step.pass_name, None)])
            steps = steps_from_sites(alone.applied)
            if steps and steps not in seen:
                seen.append(steps)
                out.append(Candidate(f"eager + {step.pass_name}", "eager", steps, alone))
    return out


def versus_compile(run: TuningRun, captured: Captured, verified: Verified) -> dict[str, Any] | None:
    """The shipped step timed against torch.compile of the original's step (the peer a user
    would otherwise run), interleaved: speedup > 1 means the shipped step is faster. None when
    the peer was not built or is what ships."""
    peer = next((c for c in run.candidates if c.name == "compile"), None)
    chosen = verified.candidate
    runner = peer.runner if peer is not None else None
    if not isinstance(runner, TrainRunner) or chosen.name == "compile":
        return None
    shipped = verified.runner
    packed = verified.replay.pack(captured.inputs)
    c = compare(
        lambda: runner.step(*captured.inputs),
        lambda: shipped(*packed),
        device=run.device,
        budget_s=run.timing_budget(),
        clock=run.clock,
    )
    run.samples["versus_compile"] = {"baseline_s": c.baseline_s, "candidate_s": c.candidate_s}
    return {"candidate": chosen.name, **timing_fields(c)}
