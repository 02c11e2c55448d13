"""Tuning the forward: the step kind of `--mode infer` (`tuner.tuning.step_kind.StepKind`).

What is judged is one call of the program. Every registered pass may apply; every backend
available for the device is a candidate (AOTInductor and torch.compile of the original are the
peers); a dynamic program is tuned at several sizes (`tuner.graph.sizes`), and its candidates
are checked and timed at each of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import fx
from torch.export import ExportedProgram

from tuner.backends import registry as backends
from tuner.backends.isolation import CompileOverrun
from tuner.contract.config import Figures, Mode, PassStep, TunedConfig
from tuner.deploy.replay import steps_of
from tuner.graph.capture import Inputs, example_inputs, to_graph_module
from tuner.graph.copying import deep_copy
from tuner.graph.shapes import spec_of
from tuner.graph.sizes import SizePoint, size_points
from tuner.host import failures
from tuner.measure.equivalence import ReferenceOutputs
from tuner.measure.inputs import distinct_inputs, fresh_inputs
from tuner.passes import pass_names
from tuner.passes.apply import Transformed, apply_steps
from tuner.search.site_search import FORWARD, Progress, SiteRun
from tuner.tuning.candidates import Candidate, compile_key, steps_from_sites
from tuner.tuning.run import Captured, TuningRun, Verified
from tuner.tuning.verify import verify_forward

# A build with inductor settings (max-autotune benchmarks GEMM choices as it compiles) against
# the default build of the same program: max-autotune 2.0x (17.3 s against 8.6 s, the
# recommendation model, 2 cores), freezing and concat-linear 0.7x.
SETTINGS_COMPILE_FACTOR = 2.0


class InferenceStep:
    """The forward as the unit of checking and timing."""

    mode: ClassVar[Mode] = "infer"
    site_run: ClassVar[SiteRun] = FORWARD
    compiling: ClassVar[str] = "compiling"

    def __init__(self, run: TuningRun) -> None:
        self.run = run

    def passes(self) -> list[str]:
        return self.run.options.passes or pass_names()

    def capture(self, program: ExportedProgram, say: Progress) -> Captured:
        run = self.run
        say(0.0, "capturing graph")
        gm0 = to_graph_module(program).to(run.device.torch_device)
        inputs = run.to_device(example_inputs(program))
        spec = spec_of(gm0)
        skipped: list[str] = []
        if spec is not None:
            say(0.02, "choosing sizes")
            points, skipped = size_points(spec, inputs, run.options.sizes, lambda a: gm0(*a))
            run.points = [SizePoint(p.label, p.sizes, run.to_device(p.inputs)) for p in points]
        return Captured(gm0, inputs, spec, skipped)

    def baseline(self, gm0: fx.GraphModule) -> Callable[..., Any]:
        return gm0

    def timed_call(self, runner: Any) -> Callable[..., Any]:
        return runner

    def before_search(self, say: Progress) -> None:
        return None

    def candidates(
        self, gm0: fx.GraphModule, inputs: Inputs, greedy: list[PassStep], every: list[str]
    ) -> list[Candidate]:
        return forward_candidates(gm0, inputs, greedy, every, self.run.backends())

    def compile_estimate(self, cand: Candidate) -> float | None:
        """From this machine's compiles; a build with inductor settings not yet measured here is
        planned at `SETTINGS_COMPILE_FACTOR` times the default build's estimate."""
        run = self.run
        nodes = len(cand.transformed.gm.graph.nodes)
        found = run.compile_times.estimate(run.hardware_key, compile_key(cand), nodes)
        if found is not None or not cand.settings:
            return found
        default = run.compile_times.estimate(run.hardware_key, cand.backend, nodes)
        return None if default is None else SETTINGS_COMPILE_FACTOR * default

    def build(self, cand: Candidate, left: float) -> backends.Built:
        """Build the runner; an AOTInductor compile runs in a child stopped after `left` s.

        torch.compile compiles on its first call, in this process: that call is made here,
        timed, so the estimate for the next one is measured too. With `isolate` (CUDA by
        default) it is first built and run once in a child stopped after `left` s, whose time
        is the estimate, so a crash or an overrun there costs only the child.
        """
        run = self.run
        t = cand.transformed
        nodes = len(t.gm.graph.nodes)
        started = time.monotonic()
        try:
            built = backends.build(
                cand.backend,
                t.gm,
                t.inputs,
                run.workdir,
                timeout_s=left,
                probe=run.isolate,
                children=run.options.children,
                settings=cand.settings,
            )
        except CompileOverrun:
            # At least this long: the next compile of this size will be skipped, not started.
            elapsed = time.monotonic() - started
            run.compile_times.record_stopped(run.hardware_key, compile_key(cand), nodes, elapsed)
            raise
        if built.compile_s is not None:
            total = built.compile_s + (built.overhead_s or 0.0)
            run.compile_times.record(run.hardware_key, compile_key(cand), nodes, total)
        elif cand.backend in backends.COMPILING:
            first = time.monotonic()
            with torch.inference_mode():
                built.runner(*t.inputs)
            run.compile_times.record(
                run.hardware_key, cand.backend, nodes, time.monotonic() - first
            )
        return built

    def check_trials(self, inputs: Inputs) -> list[Inputs]:
        return distinct_inputs([inputs, *fresh_inputs(inputs, 2)])

    def reference_call_s(self, baseline: Callable[..., Any], inputs: Inputs) -> float | None:
        memo = self.run.reference_memo(baseline)  # the baseline is the original itself
        with torch.inference_mode():
            memo.expected(inputs)
        return memo.call_s(inputs)

    def check(
        self,
        gm0: fx.GraphModule,
        inputs: Inputs,
        runner: Any,
        pack: Callable[[Inputs], Inputs],
    ) -> str | None:
        reference = ReferenceOutputs(gm0, self.check_trials(inputs), self.run.reference_memo(gm0))
        return reference.check(lambda *a: runner(*pack(a)))

    def verify(
        self, program: ExportedProgram, captured: Captured, fig: Figures, chosen: Candidate
    ) -> Verified:
        run = self.run
        memo = run.reference_memo(captured.gm)
        return verify_forward(program, captured, fig, chosen, run.points, run.device, memo)

    def finish(self, config: TunedConfig, captured: Captured, verified: Verified) -> TunedConfig:
        return config

    @classmethod
    def profiled_baseline(
        cls, module: torch.nn.Module, config: TunedConfig, device: torch.device
    ) -> Callable[..., Any]:
        return module


def forward_candidates(
    gm0: fx.GraphModule,
    inputs: Inputs,
    greedy: list[PassStep],
    every: list[str],
    wanted: list[str],
) -> list[Candidate]:
    """The plain peers first, then under each of `wanted` the searched passes, the original
    and every pass, most promising first.

    The peers (the original under `backends.PEERS`, timed as shipped) are what a user would
    pick instead of fxtune; they are candidates whatever passes were asked for, so the chosen
    result (the fastest candidate that beats the original) is by construction at least as fast
    as each of them as measured in this run. A backend restriction given by the caller
    (`wanted`) is honoured for the peers too.
    """
    # Building a runner never changes its module (eager runs it, inductor exports it), so
    # one rewritten module serves every backend, as gm0 serves the baseline and the peers.
    try:
        blind = apply_steps(deep_copy(gm0), inputs, [(p, None) for p in every])
    except Exception as exc:  # only the "every pass" candidates are lost
        failures.fallback(exc, "applying every pass")
        blind = Transformed(gm0, inputs)
    blind_steps = steps_from_sites(blind.applied)
    tuned = apply_steps(deep_copy(gm0), inputs, steps_of(greedy)) if greedy else None
    blind_differs = bool(blind.applied) and blind_steps != greedy
    original = Transformed(gm0, inputs)
    out = [Candidate(b, b, [], original) for b in backends.PEERS if b in wanted]
    for b in wanted:
        if tuned is not None:
            out.append(Candidate(f"{b} + tuned passes", b, greedy, tuned))
        if b != "eager" and b not in backends.PEERS:
            out.append(Candidate(b, b, [], original))
        if blind_differs:
            out.append(Candidate(f"{b} + every pass", b, blind_steps, blind))
    return out
