"""Tuning a whole program: one pipeline, whatever is tuned (outputs.py writes the files).

The result is never worse than the original: every whole-model candidate (the original under
AOTInductor and torch.compile, the passes under each backend) is timed against the untouched
original, and one is chosen only when its speedup interval clears 1 + epsilon; otherwise the
original stands. Among those, the fastest is chosen, so it is never slower than the plain
AOTInductor or torch.compile of the original as measured in the same run.

The pipeline, each step its own collaborator over one `TuningRun` (`tuner.tuning.run`):
capture (the step kind) -> site search (`tuner.search.site_search`) -> candidates (the step
kind, `tuner.tuning.candidates`) -> judge (`tuner.tuning.judge`, within `tuner.tuning.budget`)
-> choose (`tuner.tuning.choose`) -> verify (the step kind, `tuner.tuning.verify`, size buckets
in `tuner.tuning.bucketing`) -> the config (`tuner.tuning.tuned_config`). What is tuned, the
forward or a training step, is the step kind's alone (`tuner.tuning.modes.STEP_KINDS`).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.export import ExportedProgram

from tuner.backends import registry as backends
from tuner.backends.isolation import Children
from tuner.backends.runtimes import installed_version, is_runtime
from tuner.contract.config import Figures, TunedConfig
from tuner.graph.capture import on_device, to_graph_module
from tuner.graph.copying import deep_copy
from tuner.graph.fingerprint import graph_fingerprint
from tuner.graph.sizes import SizePoint
from tuner.host import failures
from tuner.measure.equivalence import output_errors
from tuner.measure.timing import fixed_threads
from tuner.passes.apply import Transformed
from tuner.search.buckets import ORIGINAL
from tuner.search.site_search import Progress, SearchResult, SearchSettings, SiteSearch
from tuner.tuning import promise
from tuner.tuning.bucketing import (
    Bucketed,
    BucketOutcome,
    DispatchCost,
    bucketed,
)
from tuner.tuning.budget import Budget
from tuner.tuning.candidates import Candidate, compile_key, identity, size_candidates
from tuner.tuning.choose import Runoff, choose, settled_note
from tuner.tuning.judge import Judge
from tuner.tuning.modes import step_kind_for
from tuner.tuning.options import TuneOptions
from tuner.tuning.run import Captured, TuningRun, Verified, to_device
from tuner.tuning.tuned_config import tuned_config
from tuner.tuning.verify import unchanged

__all__ = [
    "BucketOutcome",
    "TuneOptions",
    "TuneOutcome",
    "Tuner",
    "output_errors",
    "to_device",
    "tune_program",
    "tuning_session",
]

# Sites covering less than this fraction of epsilon of the model's time are not timed: even
# made free, they could not move a whole-model comparison beyond its noise
# (tuner.search.site_search).
NOISE_SHARE = 0.25


@dataclass
class TuneOutcome:
    config: TunedConfig
    original: ExportedProgram
    tuned: Transformed
    runner: Callable[..., Any]
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    # The file that ships with the chosen module: its AOTInductor package under inductor, its
    # artifact under a runtime (`tuner.backends.runtime_build`).
    package: Path | None = None
    points: list[SizePoint] = field(default_factory=list)  # the sizes tuned at, example first
    # time.monotonic() at which the run's budget ends, and the estimated compile of the
    # package's instrumented twin (None: unknown): the profile step builds it only if it fits.
    deadline: float | None = None
    twin_estimate_s: float | None = None
    # Where winners differ by size (config.buckets set): every bucket's verified module, and
    # the one program that dispatches between them (`tuner.deploy.dispatch.dispatching_program`),
    # which is what `tuned.pt2` holds; `tuned` and `runner` are then the example's bucket.
    buckets: list[BucketOutcome] = field(default_factory=list)
    dispatch: ExportedProgram | None = None


@contextmanager
def tuning_session(options: TuneOptions) -> Iterator[TuneOptions]:
    """The run's thread count and work folder, both undone on exit; owned by the caller.

    The caller keeps the session open while it uses the outcome (the CLI copies the chosen
    package out of the work folder), and nothing outlives it: torch's thread count is restored,
    the folder of compiled packages removed (a folder the caller gave stays theirs) and a
    compile child started ahead (`Children`, where compiles are isolated) ended.
    """
    with fixed_threads(options.threads), ExitStack() as stack:
        workdir = options.workdir
        if workdir is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="fxtune-"))
            workdir = Path(folder)
        children = options.children
        if children is None:
            device = options.device
            on = str(device) if device.kind == "cuda" else None  # type: ignore[union-attr]
            children = stack.enter_context(Children(ahead=options.isolates, device=on))
            children.start()
        yield dataclasses.replace(options, workdir=workdir, children=children)


def _builds_runtimes(options: TuneOptions) -> bool:
    """Whether the run may build a runtime's artifact (an inference run on a CPU that has one)."""
    device = options.device
    if options.mode != "infer" or device.kind != "cpu":  # type: ignore[union-attr]
        return False
    wanted = options.backends or backends.available_backends(device)  # type: ignore[arg-type]
    return any(is_runtime(b) and installed_version(b) for b in wanted)


def _silent(_fraction: float, _message: str) -> None:
    return None


class Tuner:
    """One tuning run, in named steps; `tuning_session` supplies its threads and work folder."""

    def __init__(self, options: TuneOptions) -> None:
        self.run = TuningRun.open(options)
        self.kind = step_kind_for(options.mode)(self.run)
        self.budget = Budget(self.run, self.kind)
        self.judge = Judge(self.run, self.kind, self.budget)

    def tune(self, program: ExportedProgram, progress: Progress | None = None) -> TuneOutcome:
        run, kind, say = self.run, self.kind, progress or _silent
        run.started = run.options.started or time.monotonic()
        run.spent["loading"] = time.monotonic() - run.started  # by the caller, in the budget
        # The fingerprint of the program as exported (deployments compute it on theirs), then
        # the program itself on the device: torch.export's pass also moves devices baked into
        # the graph, where `module.to()` would leave them on the CPU. The caller's program moves.
        with run.clocked("capture"):
            fingerprint = graph_fingerprint(to_graph_module(program))
            if run.device.kind != "cpu":
                program = on_device(program, run.device.torch_device)
            captured = kind.capture(program, say)
            self.budget.read_original(kind.baseline(captured.gm), captured)
        if run.options.children is not None and _builds_runtimes(run.options):
            # Started once the original's call times are read, at every size: they bound every
            # check and glance of the run, and read while this child imported torch one was
            # 1.8-2x its quiet figure (the zoo's dlrm: 8.3-9.5 ms against 3.7-4.7 ms).
            run.options.children.start_serving()
        search, run.candidates, figures, settled = self._search_and_judge(captured, say)
        runoff = self.judge.runoff(captured, run.candidates, figures, say, settled)
        epsilon = run.options.epsilon
        chosen_fig, chosen = choose(
            captured, run.candidates, figures, run.peer_notes, runoff, epsilon, settled
        )
        say(0.85, "verifying")
        with run.clocked("verification"):
            verified, buckets = self._verify(program, captured, figures, chosen_fig, chosen)
        config = tuned_config(run, kind.mode, fingerprint, captured, search, figures, verified)
        config = kind.finish(config, captured, verified)
        config.buckets = [b.bucket for b in buckets.outcomes]
        if buckets.note:
            config.tuning["buckets"] = buckets.note
        say(0.9, "tuning done")
        return self._outcome(program, config, verified, buckets)

    def _search_and_judge(
        self, captured: Captured, say: Progress
    ) -> tuple[SearchResult, list[Candidate], list[Figures], list[Runoff]]:
        """The peers are the floor, so they are built first, quickest first, as many as are
        expected to fit, then timed fastest first (`Judge.peers`); one that is not expected to
        fit goes after the passes, with what is left.
        Where no peer is expected to fit, every pass goes first, in eager (no compile) and
        with the quickest compile that fits, and the report says so; where a peer needs no
        compile (a CUDA graph), every pass under it goes with the peers. Then the
        site search, and the candidates it makes, in the order they are judged; last,
        inductor's settings on the fastest inductor candidate, where they can still win."""
        kind, gm0, inputs = self.kind, captured.gm, captured.inputs
        peers = [c for c in kind.candidates(gm0, inputs, [], []) if not c.passes]
        peers = [c for c in peers if c.backend != "eager"]
        first, last = self.budget.plan_peers(peers, say, kind.baseline(gm0))
        early, building_s = first, 0.0
        if (last and not first) or any(c.backend not in backends.COMPILING for c in first):
            began = time.monotonic()
            with self.run.clocked("applying passes"):
                blind = kind.candidates(gm0, inputs, [], kind.passes())
            building_s = time.monotonic() - began  # applying every pass, as after the search
            if first:
                early = first + self.budget.uncompiled_with_passes(blind, first, say)
            else:
                early = self.budget.stand_ins(blind, say)
        figures, rounds = self.judge.peers(captured, first, say, (0.05, 0.25))
        settled = self.judge.settle_peers(captured, first, figures, rounds)
        self.run.peer_notes += [settled_note(r, self.run.options.epsilon) for r in settled]
        figures += self.judge.all(captured, early[len(first) :], say, (0.25, 0.3))
        deadline = self.budget.search_deadline(early, figures, building_s)
        with self.run.clocked("site search"):
            search = self._search(captured, say, deadline)
        known = {identity(c) for c in peers + early}
        with self.run.clocked("applying passes"):
            rest = kind.candidates(gm0, inputs, search.steps, kind.passes())
        rest = self.budget.cheapest_first([c for c in rest if identity(c) not in known])
        points, wanted = self.run.points, self.run.backends()
        decisions, have = search.decisions, peers + early + rest
        rest += size_candidates(gm0, inputs, captured.spec, points, decisions, wanted, have)
        # Eager first (no build: they measure the passes' own gain), then by promise.
        eager = [c for c in rest if c.backend == "eager"]
        figures += self.judge.all(captured, eager, say, (0.6, 0.65))
        speeds = promise.measured(early + eager, figures)
        timed, hopeless = promise.by_promise([c for c in rest if c.backend != "eager"], speeds)
        figures += self.judge.all(captured, timed, say, (0.65, 0.8))
        figures += [fig for _, fig in hopeless]
        rest = eager + timed + [c for c, _ in hopeless]
        figures += self.judge.all(captured, last, say, (0.8, 0.83))
        judged = early + rest + last
        tried, hopeless = promise.with_settings(judged, figures, self.run.device.kind)
        figures += self.judge.all(captured, tried, say, (0.83, 0.85))
        figures += [fig for _, fig in hopeless]
        return search, judged + tried + [c for c, _ in hopeless], figures, settled

    def _search(self, captured: Captured, say: Progress, deadline: float) -> SearchResult:
        run = self.run
        self.kind.before_search(say)
        settings = SearchSettings(
            device=run.device,
            hardware_key=run.hardware_key,
            deadline=deadline,
            site_budget_s=run.options.site_budget_s,
            epsilon=run.options.epsilon,
            passes=self.kind.passes(),
            points=run.points if len(run.points) > 1 else [],
            model_time_s=run.model_time_s,
            run=self.kind.site_run,
            noise_share=NOISE_SHARE * run.options.epsilon,
            clock=run.clock,
        )
        search = SiteSearch(settings, run.cache).run(
            deep_copy(captured.gm), captured.inputs, lambda f, m: say(0.3 + 0.3 * f, m)
        )
        run.samples.update(search.samples)
        run.timed += search.timed
        return search

    def _verify(
        self,
        program: ExportedProgram,
        captured: Captured,
        figures: list[Figures],
        fig: Figures,
        chosen: Candidate,
    ) -> tuple[Verified, Bucketed]:
        """The choice verified (the original needs none), then refined into size buckets
        where the per-size winners differ; the example's bucket is then what is verified."""
        run = self.run
        if chosen.name == ORIGINAL:  # nothing was changed, so there is nothing to verify
            verified = unchanged(captured, fig, chosen, self.kind.baseline(captured.gm))
        else:
            verified = self.kind.verify(program, captured, fig, chosen)
        try:
            memo = run.reference_memo(captured.gm)
            points, cands, device = run.points, run.candidates, run.device
            cost = DispatchCost(run.compile_times, run.hardware_key, run.budget_left)
            buckets = bucketed(
                program, captured, points, cands, figures, fig.name, device, memo, cost
            )
        except Exception as exc:  # buckets only refine a verified decision: keep that one
            failure = failures.fallback(exc, "size buckets")
            buckets = Bucketed(note=f"not bucketed: {failure.type}: {failure.message[:300]}")
        return buckets.headline or verified, buckets

    def _outcome(
        self, program: ExportedProgram, config: TunedConfig, verified: Verified, buckets: Bucketed
    ) -> TuneOutcome:
        run = self.run
        inductor = config.backend == "inductor"
        ships_file = inductor or is_runtime(config.backend)  # a package, a runtime's artifact
        nodes = len(verified.replay.gm.graph.nodes)
        key = compile_key(verified.candidate)
        twin = run.compile_times.estimate(run.hardware_key, key, nodes)
        return TuneOutcome(
            config,
            program,
            verified.replay,
            verified.runner,
            run.samples,
            verified.candidate.package if ships_file else None,
            list(run.points),
            deadline=run.started + run.options.budget_s,
            twin_estimate_s=twin if inductor else None,
            buckets=buckets.outcomes,
            dispatch=buckets.dispatch,
        )


def tune_program(
    program: ExportedProgram, options: TuneOptions | None = None, progress: Progress | None = None
) -> TuneOutcome:
    """Tune in a session of its own unless `options.workdir` is the caller's.

    With a session of its own the work folder is gone on return, so the outcome carries no
    package (`write_outputs` then compiles one); callers that write outputs open
    `tuning_session` themselves and call this inside it. Every exception that became a verdict
    or a skip on the way is in `config.tuning["errors"]` (`tuner.host.failures`).
    """
    options = options or TuneOptions()
    with tuning_session(options) as session, failures.recording() as fell_back:
        outcome = Tuner(session).tune(program, progress)
    outcome.config.tuning["errors"] = fell_back.to_list()
    if options.workdir is None:
        outcome.package = None
    return outcome
