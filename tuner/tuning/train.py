"""Tuning a training step: the inference tuner's steps, with a training step as what is judged.

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
(`tuner.search.site_search.FORWARD_BACKWARD`):   a site's forward time says little about its
backward. The extracted site is differentiated   to its parameters and to the inputs that carry a
gradient in the step, and a rewrite must   keep every one of those gradients (checked before timing,
else "wrong outputs"). The sites   faster beyond noise make one more whole-model candidate ("winning
sites") beside every   training-safe pass and each pass that fires on its own; as in inference, the
whole step's   check and timing decide what ships, so a site that wins alone but not in the step is
not   kept.
- Tuned at the example's size only (the sizes of a dynamic program are not swept).
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import fx
from torch.export import ExportedProgram

from tuner.backends import registry as backends
from tuner.contract.config import Figures, PassStep, TrainingSetup, TunedConfig, Verification
from tuner.contract.errors import InputError
from tuner.deploy.replay import replay_steps, steps_of
from tuner.graph.capture import Inputs, example_inputs, to_graph_module
from tuner.graph.nodes import arg, aten
from tuner.graph.shapes import spec_of
from tuner.host import failures
from tuner.host.torch_compat import pytree
from tuner.measure.timing import (
    compare,
    fixed_threads,
    fresh_inputs,
    quick_per_call_s,
    timing_fields,
    verdict,
)
from tuner.passes import get_pass, pass_names
from tuner.passes.apply import Transformed, apply_steps
from tuner.search.site_search import Progress, SearchResult
from tuner.training.step import (
    LOSS_RULE,
    RUNNERS,
    ReferenceSteps,
    TrainRunner,
    eager_runner,
)
from tuner.tuning.tuner import (
    Candidate,
    Tuner,
    _Captured,
    _original,
    _steps_from_sites,
    _Verified,
    to_device,
)

# What a backend is called in the compile-time store: a compile of forward + backward costs
# more than a forward-only one, so its estimates are kept apart.
COMPILE_KEY = "compile-train"
GRAPHED = "CUDA graphs are captured for inference (no autograd history): not a training candidate"
NOT_TRAINABLE = {
    "inductor": "AOTInductor packages are inference-only (no backward): not a training candidate",
    "cudagraph": GRAPHED,
    "compile-cudagraphs": GRAPHED,
}


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
        flat = pytree.tree_flatten(copy.deepcopy(gm)(*inputs))[0]
    for j, t in enumerate(flat):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() == 0:
            return f"the program's scalar output {j}"
    return LOSS_RULE


class TrainTuner(Tuner):
    """`Tuner` with a training step as the unit of checking and timing."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.optimizer: str | None = options.optimizer
        self.notes: list[str] = []
        self._baseline: TrainRunner | None = None
        self._reference: ReferenceSteps | None = None  # the original's checked steps

    def _passes(self) -> list[str]:
        asked = self.options.passes
        unsafe = [p for p in asked or [] if not get_pass(p).train_safe]
        if unsafe:
            raise InputError(f"not valid in a training step: {', '.join(unsafe)}")
        return [p for p in (asked or pass_names()) if get_pass(p).train_safe]

    def _capture(self, program: ExportedProgram, say: Progress) -> _Captured:
        say(0.0, "capturing graph (training)")
        gm0 = to_graph_module(program, train=True).to(self.device.torch_device)
        inputs = tuple(to_device(x, self.device) for x in example_inputs(program))
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
        return _Captured(gm0, inputs, spec, skipped)

    def _baseline_runner(self, gm0: fx.GraphModule) -> TrainRunner:
        if self._baseline is None:
            self._baseline = eager_runner(gm0, self.optimizer, self.device.torch_device)
        return self._baseline

    def _model_time_s(self, captured: _Captured) -> float | None:
        """The original's seconds per training step (CPU): it bounds the checks, and a site's
        forward + backward cannot take longer (`tuner.search.site_search.CONSISTENCY_SLACK`)."""
        if self.device.kind != "cpu":
            return None
        runner = self._baseline_runner(captured.gm)
        with fixed_threads(self.options.threads):
            return quick_per_call_s(lambda: runner.step(*captured.inputs))

    def _search(
        self, captured: _Captured, started: float, say: Progress, deadline: float
    ) -> SearchResult:
        say(0.3, "searching sites (forward + backward)")
        self._note(
            "per-site decisions time each site's forward + backward on its own (eager; the "
            "optimizer step is not in it: passes keep the parameters, so it costs the same)"
        )
        return super()._search(captured, started, say, deadline)

    def _note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    def _candidates(
        self, gm0: fx.GraphModule, inputs: Inputs, greedy: list[PassStep], every: list[str]
    ) -> list[Candidate]:
        asked = self.options.backends or backends.available_backends(self.device)
        wanted = [b for b in asked if b in RUNNERS]
        for b in asked:
            if b in NOT_TRAINABLE:
                self._note(f"{b}: {NOT_TRAINABLE[b]}")
        blind = apply_steps(copy.deepcopy(gm0), inputs, [(p, None) for p in every])
        blind_steps = _steps_from_sites(blind.applied)
        original = Transformed(gm0, inputs)
        out = [Candidate(b, b, [], original) for b in wanted if b != "eager"]
        if not blind.applied:
            return out
        seen = [blind_steps]
        if greedy and greedy not in seen:
            seen.append(greedy)
            won = apply_steps(copy.deepcopy(gm0), inputs, steps_of(greedy))
            out += [Candidate(f"{b} + winning sites", b, greedy, won) for b in wanted]
        out += [Candidate(f"{b} + every pass", b, blind_steps, blind) for b in wanted]
        if len(blind_steps) > 1 and "eager" in wanted:
            for step in blind_steps:
                alone = apply_steps(copy.deepcopy(gm0), inputs, [(step.pass_name, None)])
                steps = _steps_from_sites(alone.applied)
                if steps and steps not in seen:
                    seen.append(steps)
                    out.append(Candidate(f"eager + {step.pass_name}", "eager", steps, alone))
        return out

    def _compile_wont_fit(self, cand: Candidate, left: float) -> str | None:
        if cand.backend not in backends.COMPILING:
            return None
        nodes = len(cand.transformed.gm.graph.nodes)
        estimate = self.compile_times.estimate(self.hardware_key, COMPILE_KEY, nodes)
        if estimate is None or estimate <= left - 2.0:
            return None
        return (
            f"skipped: compiling the training step is estimated at {estimate:.0f} s "
            f"({nodes} nodes) and {left:.0f} s of the time budget are left"
        )

    def _build(self, cand: Candidate, left: float) -> backends.Built:
        """A training runner on a copy of the candidate's module; a compile happens on its
        first step, made (and timed, for the next estimate) here."""
        t = cand.transformed
        runner = RUNNERS[cand.backend](t.gm, self.optimizer, self.device.torch_device)
        if cand.backend in backends.COMPILING:
            nodes = len(t.gm.graph.nodes)
            first = time.monotonic()
            runner.record(t.inputs, 0)
            self.compile_times.record(
                self.hardware_key, COMPILE_KEY, nodes, time.monotonic() - first
            )
        return backends.Built(runner)

    def _judge_at(
        self, gm0: fx.GraphModule, inputs: Inputs, cand: Candidate, runner: Any, started: float
    ) -> tuple[dict[str, Any], Any]:
        """Check the candidate's training step against the original's, then time both."""
        t = cand.transformed
        if self._reference is None:
            trials = [inputs, *fresh_inputs(inputs, 2)]
            self._reference = ReferenceSteps(gm0, self.optimizer, trials)
        try:
            wrong = self._reference.check(runner, t.pack)
        except Exception as exc:
            reason = failures.fallback(exc, f"checking candidate {cand.name}").reason
            return {"verdict": "failed to run", "reason": reason}, None
        if wrong is not None:
            return {"verdict": "wrong outputs", "reason": wrong}, None
        base = self._baseline_runner(gm0)
        packed = t.pack(inputs)
        budget = min(self.options.whole_model_budget_s, max(self._remaining(started), 0.5))
        c = compare(
            lambda: base.step(*inputs),
            lambda: runner.step(*packed),
            device=self.device,
            budget_s=budget,
        )
        self.timed += 1
        if c.rounds == 0:
            reason = "no timed round fitted in what was left of the time budget"
            return {"verdict": "not measured", "reason": reason}, c
        return {**timing_fields(c), "verdict": verdict(c, self.options.epsilon)}, c

    def _verify(
        self, program: ExportedProgram, captured: _Captured, fig: Figures, chosen: Candidate
    ) -> _Verified:
        """The config replayed from the original (eager) and the chosen runner must both train
        as the original does on fresh inputs; else the original ships, with the reason."""
        gm0, inputs = captured.gm, captured.inputs
        if chosen.name == "original":
            verification = Verification(
                inputs=0,
                max_abs_error=0.0,
                max_rel_error=0.0,
                passed=True,
                reason="the original program stands: nothing to verify",
            )
            base = self._baseline_runner(gm0)
            return _Verified(fig, chosen, Transformed(gm0, inputs), base.step, verification)
        replay = replay_steps(program, chosen.passes, train=True)
        replay.gm.to(self.device.torch_device)
        trials = fresh_inputs(inputs, 3, seed=1234)
        reference = ReferenceSteps(gm0, self.optimizer, trials, seed=1234)
        device = self.device.torch_device
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
            fig, chosen = _original(captured, "wrong outputs", reason)
            base = self._baseline_runner(gm0)
            return _Verified(fig, chosen, Transformed(gm0, inputs), base.step, verification)
        step = runner.step if runner is not None else eager_runner(replay.gm, self.optimizer).step
        return _Verified(fig, chosen, replay, step, verification)

    def _versus_compile(
        self, captured: _Captured, verified: _Verified, started: float
    ) -> dict[str, Any] | None:
        """The shipped step timed against torch.compile of the original's step (the peer a
        user would otherwise run), interleaved: speedup > 1 means the shipped step is faster.
        None when the peer was not built or is what ships."""
        peer = next((c for c in self.candidates if c.name == "compile"), None)
        chosen = verified.candidate
        runner = peer.runner if peer is not None else None
        if not isinstance(runner, TrainRunner) or chosen.name == "compile":
            return None
        shipped = verified.runner
        packed = verified.replay.pack(captured.inputs)
        budget = min(self.options.whole_model_budget_s, max(self._remaining(started), 0.5))
        c = compare(
            lambda: runner.step(*captured.inputs),
            lambda: shipped(*packed),
            device=self.device,
            budget_s=budget,
        )
        self.samples["versus_compile"] = {"baseline_s": c.baseline_s, "candidate_s": c.candidate_s}
        return {"candidate": chosen.name, **timing_fields(c)}

    def _config(
        self,
        fingerprint: str,
        captured: _Captured,
        search: SearchResult,
        figures: list[Figures],
        verified: _Verified,
        started: float,
    ) -> TunedConfig:
        config = super()._config(fingerprint, captured, search, figures, verified, started)
        versus = self._versus_compile(captured, verified, started)
        tuning = {**config.tuning, "notes": self.notes, "versus_compile": versus}
        setup = TrainingSetup(
            optimizer=self.optimizer, loss=loss_rule(captured.gm, captured.inputs)
        )
        return config.model_copy(update={"mode": "train", "training": setup, "tuning": tuning})
