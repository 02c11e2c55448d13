"""Tuning a whole program: site search, backend choice, verification (outputs.py writes files).

The result is never worse than the original: every whole-model candidate (the original under
AOTInductor and torch.compile, the passes under each backend) is timed against the untouched
original, and one is chosen only when its speedup interval clears 1 + epsilon; otherwise the
original stands. Among those, the fastest is chosen, so it is never slower than the plain
AOTInductor or torch.compile of the original as measured in the same run.
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch.export import ExportedProgram

from tuner.backends import registry as backends
from tuner.backends.compile_time import CompileTimes
from tuner.backends.isolation import CompileCrashed, CompileOverrun
from tuner.contract.config import (
    Bucket,
    Figures,
    Mode,
    PassStep,
    SiteDecision,
    TunedConfig,
    Verification,
)
from tuner.contract.device import CPU, Device
from tuner.contract.errors import InputError
from tuner.contract.training import OPTIMIZER_NAMES
from tuner.deploy.dispatch import dispatching_program
from tuner.deploy.replay import replay_steps, steps_of
from tuner.graph.capture import Inputs, example_inputs, on_device, to_graph_module
from tuner.graph.fingerprint import graph_fingerprint
from tuner.graph.shapes import spec_of
from tuner.graph.sites import Site
from tuner.graph.sizes import SizePoint, size_points
from tuner.host import failures
from tuner.host.hardware import describe, hardware_key
from tuner.measure.timing import (
    check_outputs,
    compare,
    fixed_threads,
    fresh_inputs,
    quick_per_call_s,
    require_timing,
    timing_fields,
    verdict,
)
from tuner.passes import pass_names
from tuner.passes.apply import Transformed, apply_steps
from tuner.search.across_sizes import combined_verdict, size_figures
from tuner.search.buckets import ORIGINAL, Plan, bucket_dim, plan_buckets, to_bucket
from tuner.search.decisions import DecisionCache
from tuner.search.site_search import SITE_RUNS, Progress, SearchResult, SearchSettings, SiteSearch

# A compile is started only if its estimate leaves this much of the budget for timing it.
MIN_TIMING_S = 2.0
# Model calls a candidate's output check makes (3 input sets: the reference twice, the
# candidate, the float64 reference at several times the cost), before any timing.
CHECK_CALLS = 20
# Compiles made in a child process that is stopped when it overruns (tuner.backends.isolation).
STOPPABLE = ("inductor",)
# Sites covering less than this fraction of epsilon of the model's time are not timed: even
# made free, they could not move a whole-model comparison beyond its noise
# (tuner.search.site_search).
NOISE_SHARE = 0.25
# The share of `budget_s` kept for what follows the last budget check: verification, writing
# the program and package, and the profiles (`tuner.tuning.outputs`).
FINISH_SHARE = 0.2


@dataclass
class TuneOptions:
    device: Device | str = CPU  # parsed in __post_init__: the run sees only a Device
    budget_s: float = 120.0
    epsilon: float = 0.02
    backends: list[str] | None = None  # default: every backend available for the device
    passes: list[str] | None = None  # default: every registered pass
    cache_path: Path | None = None
    workdir: Path | None = None  # where compiled packages go; a temporary folder by default
    # CPU threads for the whole run (and the hardware key). On a shared machine fewer threads
    # than cores keeps other processes from stalling multi-threaded kernels mid-measurement.
    threads: int | None = None
    whole_model_budget_s: float = 6.0
    site_budget_s: float = 1.5
    # Sizes to tune a dynamic program at, per dynamic dim ({"batch": [1, 32, 512]}); None:
    # each dim's minimum, the example and a large value (tuner.graph.sizes.default_sizes).
    sizes: dict[str, list[int]] | None = None
    # "infer" tunes the forward; "train" a training step (tuner.tuning.train): forward, loss,
    # backward and, with `optimizer` (tuner.training.step.OPTIMIZERS), one optimizer step.
    mode: Mode = "infer"
    optimizer: str | None = None
    # Build each torch.compile / CUDA-graph candidate once in a child process first, so one
    # that crashes (a segfault, a CUDA error) is recorded as such and tuning goes on; None: on
    # CUDA only, where such crashes were seen and a compile costs more than the child.
    isolate_compiles: bool | None = None

    def __post_init__(self) -> None:
        self.device = Device.parse(self.device)
        if self.mode not in TUNERS:
            raise InputError(f"unknown mode {self.mode!r}; known: {', '.join(TUNERS)}")
        if self.optimizer is not None:
            if self.mode != "train":
                raise InputError("--optimizer applies to --mode train only")
            if self.optimizer not in OPTIMIZER_NAMES:
                known = ", ".join(OPTIMIZER_NAMES)
                raise InputError(f"unknown optimizer {self.optimizer!r}; known: {known}")


@dataclass
class Candidate:
    name: str
    backend: str
    passes: list[PassStep]
    transformed: Transformed
    runner: Callable[..., Any] | None = None
    package: Path | None = None


@dataclass
class TuneOutcome:
    config: TunedConfig
    original: ExportedProgram
    tuned: Transformed
    runner: Callable[..., Any]
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    package: Path | None = None  # the AOTInductor package of the chosen module, if inductor
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


@dataclass
class BucketOutcome:
    """One size bucket as it ships: its config record, replayed module, runner and package."""

    bucket: Bucket
    tuned: Transformed
    runner: Callable[..., Any]
    package: Path | None = None


def to_device(x: Any, device: Device) -> Any:
    return x.to(device.torch_device) if isinstance(x, torch.Tensor) else x


def _first_tensor_outputs(out: Any) -> list[torch.Tensor]:
    flat, _ = torch.utils._pytree.tree_flatten(out)
    return [t for t in flat if isinstance(t, torch.Tensor)]


def output_errors(
    reference: Callable[..., Any], candidate: Callable[..., Any], trials: list[Inputs]
) -> tuple[float, float]:
    worst_abs = worst_rel = 0.0
    with torch.inference_mode():
        for inputs in trials:
            for e, g in zip(
                _first_tensor_outputs(reference(*inputs)),
                _first_tensor_outputs(candidate(*inputs)),
                strict=True,
            ):
                if not e.is_floating_point():
                    worst_abs = max(worst_abs, float((e != g).any()))
                    continue
                diff = (e.double() - g.double()).abs()
                worst_abs = max(worst_abs, float(diff.max()) if diff.numel() else 0.0)
                scale = e.double().abs().max().clamp_min(1e-12)
                worst_rel = max(worst_rel, float(diff.max() / scale) if diff.numel() else 0.0)
    return worst_abs, worst_rel


@contextmanager
def tuning_session(options: TuneOptions) -> Iterator[TuneOptions]:
    """The run's thread count and work folder, both undone on exit; owned by the caller.

    The caller keeps the session open while it uses the outcome (the CLI copies the chosen
    package out of the work folder), and nothing outlives it: torch's thread count is restored
    and the folder of compiled packages removed (a folder the caller gave stays theirs).
    """
    with fixed_threads(options.threads), ExitStack() as stack:
        workdir = options.workdir
        if workdir is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="fxtune-"))
            workdir = Path(folder)
        yield dataclasses.replace(options, workdir=workdir)


@dataclass
class _Captured:
    """The program as the tuner measures it: on the device, with the sizes it is tuned at."""

    gm: fx.GraphModule
    inputs: Inputs
    spec: Any  # tuner.graph.shapes.ShapeSpec | None
    skipped: list[str]


@dataclass
class _Verified:
    """What ships after verification: the chosen candidate, or the original when it failed."""

    figures: Figures
    candidate: Candidate
    replay: Transformed
    runner: Callable[..., Any]
    verification: Verification


class Tuner:
    """One tuning run, in named steps; `tuning_session` supplies its threads and work folder."""

    def __init__(self, options: TuneOptions) -> None:
        self.device = require_timing(Device.parse(options.device))
        if options.workdir is None:
            raise ValueError("Tuner needs a work folder: open a tuning_session(options) first")
        self.options = options
        self.hardware = describe(self.device)
        self.cache = DecisionCache(options.cache_path)
        self.hardware_key = hardware_key(self.hardware)
        self.compile_times = CompileTimes.for_cache(options.cache_path)
        self.samples: dict[str, dict[str, list[float]]] = {}
        self.timed = 0
        self.workdir = options.workdir
        isolate = options.isolate_compiles
        self.isolate = self.device.kind == "cuda" if isolate is None else isolate
        self.points: list[SizePoint] = []  # the example size first, then further sizes
        self.model_time_s: float | None = None  # the original's seconds per call (CPU)
        self.peer_notes: list[str] = []  # what the peers' compiles were expected to cost
        self.candidates: list[Candidate] = []  # every whole-model candidate, once judged
        self.peers_late = False  # the peers were not expected to fit, so they go last

    def _remaining(self, started: float) -> float:
        """Seconds left for tuning proper (the finishing share of the budget excluded)."""
        usable = self.options.budget_s * (1 - FINISH_SHARE)
        return usable - (time.monotonic() - started)

    def _candidates(
        self, gm0: fx.GraphModule, inputs: Inputs, greedy: list[PassStep], every: list[str]
    ) -> list[Candidate]:
        """Whole-model candidates: the plain peers first, then the rest, most promising first.

        The peers (the original under `backends.PEERS`, timed as shipped) are what a user would
        pick instead of fxtune; they are candidates whatever passes were asked for, so the
        chosen result (the fastest candidate that beats the original) is by construction at
        least as fast as each of them as measured in this run. A backend restriction given
        by the caller (`options.backends`) is honoured for the peers too.
        """
        # Building a runner never changes its module (eager runs it, inductor exports it), so
        # one rewritten module serves every backend, as gm0 serves the baseline and the peers.
        try:
            blind = apply_steps(copy.deepcopy(gm0), inputs, [(p, None) for p in every])
        except Exception as exc:  # only the "every pass" candidates are lost
            failures.fallback(exc, "applying every pass")
            blind = Transformed(gm0, inputs)
        blind_steps = _steps_from_sites(blind.applied)
        tuned = apply_steps(copy.deepcopy(gm0), inputs, steps_of(greedy)) if greedy else None
        wanted = self.options.backends or backends.available_backends(self.device)
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

    def _size_candidates(
        self, captured: _Captured, search: SearchResult, have: list[Candidate]
    ) -> list[Candidate]:
        """Per measured size of a dynamic program: the never-worse sites plus the sites faster
        beyond noise at that size (right at every size), as whole-model candidates under each
        backend, so that a size bucket can run the pass set that won at its sizes.

        Timed last (only if the budget allows); a set the chaining cannot replay exactly
        (a later pass's site found only after an earlier rewrite that this set leaves out, or
        the reverse) is not offered, and neither is one another candidate already has.
        """
        if bucket_dim(captured.spec, self.points) is None:
            return []
        wanted = self.options.backends or backends.available_backends(self.device)
        seen = [c.passes for c in have]
        out: list[Candidate] = []
        for point in sorted(self.points, key=lambda p: tuple(p.sizes.values())):
            steps = _steps_from_decisions(search.decisions, point.label)
            if not steps or steps in seen:
                continue
            seen.append(steps)
            built = apply_steps(copy.deepcopy(captured.gm), captured.inputs, steps_of(steps))
            if _steps_from_sites(built.applied) != steps:
                continue
            out += [
                Candidate(f"{b} + passes faster at {point.label}", b, steps, built) for b in wanted
            ]
        return out

    def _judge_at(
        self, gm0: fx.GraphModule, inputs: Inputs, cand: Candidate, runner: Any, started: float
    ) -> tuple[dict[str, Any], Any]:
        """Check and time a built candidate at one size: (figure fields, comparison or None)."""
        t = cand.transformed
        packed = t.pack(inputs)
        try:
            wrong = check_outputs(
                gm0, lambda *a: runner(*t.pack(a)), [inputs, *fresh_inputs(inputs, 2)]
            )
        except Exception as exc:
            reason = failures.fallback(exc, f"checking candidate {cand.name}").reason
            return {"verdict": "failed to run", "reason": reason}, None
        if wrong is not None:
            return {"verdict": "wrong outputs", "reason": wrong}, None
        budget = min(self.options.whole_model_budget_s, max(self._remaining(started), 0.5))
        c = compare(
            lambda: gm0(*inputs), lambda: runner(*packed), device=self.device, budget_s=budget
        )
        self.timed += 1
        if c.rounds == 0:
            reason = "no timed round fitted in what was left of the time budget"
            return {"verdict": "not measured", "reason": reason}, c
        return {**timing_fields(c), "verdict": verdict(c, self.options.epsilon)}, c

    def _judge(
        self, gm0: fx.GraphModule, inputs: Inputs, cand: Candidate, started: float
    ) -> Figures:
        fig = dict(name=cand.name, backend=cand.backend, passes=cand.passes)
        left = self._remaining(started)
        if left < 1.0:
            return Figures(**fig, verdict="not measured", reason="time budget spent")
        skip = self._check_wont_fit(left) or self._compile_wont_fit(cand, left)
        if skip is not None:
            return Figures(**fig, verdict="not measured", reason=skip)
        try:
            built = self._build(cand, left)
        except CompileOverrun as exc:
            failures.fallback(exc, f"building candidate {cand.name}")
            return Figures(**fig, verdict="not measured", reason=str(exc))
        except CompileCrashed as exc:
            failures.fallback(exc, f"building candidate {cand.name}")
            return Figures(**fig, verdict="crashed", reason=str(exc))
        except Exception as exc:
            reason = failures.fallback(exc, f"building candidate {cand.name}").reason
            return Figures(**fig, verdict="failed to run", reason=reason)
        runner = cand.runner = built.runner
        cand.package = built.package
        per_size = []
        for i, point in enumerate(self.points or [SizePoint("example", {}, inputs)]):
            if i and self._remaining(started) < MIN_TIMING_S:
                # Checking at a further size costs calls at that size (a batch of 64 can take
                # seconds); unmeasured, the size runs another bucket's decision or the original.
                fields = {"verdict": "not measured", "reason": "time budget spent"}
                per_size.append(size_figures(point.label, point.sizes, fields))
                continue
            at = inputs if i == 0 else point.inputs
            fields, c = self._judge_at(gm0, at, cand, runner, started)
            if c is not None:
                suffix = f"@{point.label}" if i else ""
                self.samples[f"model:{cand.name}{suffix}"] = {
                    "baseline_s": c.baseline_s,
                    "candidate_s": c.candidate_s,
                }
            per_size.append(size_figures(point.label, point.sizes, fields))
            if fields["verdict"] in ("wrong outputs", "failed to run"):
                break
        head = per_size[0].model_dump(exclude={"label", "sizes"})
        if len(self.points) <= 1:
            return Figures(**fig, **head)
        verdict_, reason = combined_verdict(per_size)
        head.update(verdict=verdict_, reason=reason or head.get("reason"))
        return Figures(**fig, **head, per_size=per_size)

    def _check_wont_fit(self, left: float) -> str | None:
        """Why a candidate is not started: checking its outputs alone would overrun."""
        if self.model_time_s is None:
            return None
        needed = CHECK_CALLS * self.model_time_s + MIN_TIMING_S
        if needed <= left:
            return None
        return (
            f"skipped: checking its outputs and timing it need about {needed:.0f} s "
            f"and {left:.0f} s of the time budget are left"
        )

    def _compile_wont_fit(self, cand: Candidate, left: float) -> str | None:
        """Why a compile is not started (its estimate exceeds what is left), or None."""
        if cand.backend not in backends.COMPILING:
            return None
        nodes = len(cand.transformed.gm.graph.nodes)
        estimate = self.compile_times.estimate(self.hardware_key, cand.backend, nodes)
        if estimate is None and self.peers_late and cand.backend not in STOPPABLE:
            # Nothing measured, and the prior already said the peers will not fit: a compile
            # in this process cannot be stopped, so it is not started on that prospect.
            estimate, _ = self.compile_times.planning_estimate(
                self.hardware_key, cand.backend, nodes
            )
        if estimate is None or estimate <= left - MIN_TIMING_S:
            return None
        return (
            f"skipped: compiling is estimated at {estimate:.0f} s ({nodes} nodes) and "
            f"{left:.0f} s of the time budget are left"
        )

    def _build(self, cand: Candidate, left: float) -> backends.Built:
        """Build the runner; an AOTInductor compile runs in a child stopped after `left` s.

        torch.compile compiles on its first call, in this process: that call is made here,
        timed, so the estimate for the next one is measured too. With `isolate` (CUDA by
        default) it is first built and run once in a child stopped after `left` s, whose time
        is the estimate, so a crash or an overrun there costs only the child.
        """
        t = cand.transformed
        nodes = len(t.gm.graph.nodes)
        started = time.monotonic()
        try:
            built = backends.build(
                cand.backend, t.gm, t.inputs, self.workdir, timeout_s=left, probe=self.isolate
            )
        except CompileOverrun:
            # At least this long: the next compile of this size will be skipped, not started.
            elapsed = time.monotonic() - started
            self.compile_times.record(self.hardware_key, cand.backend, nodes, elapsed)
            raise
        if built.compile_s is not None:
            total = built.compile_s + (built.overhead_s or 0.0)
            self.compile_times.record(self.hardware_key, cand.backend, nodes, total)
        elif cand.backend in backends.COMPILING:
            first = time.monotonic()
            with torch.inference_mode():
                built.runner(*t.inputs)
            self.compile_times.record(
                self.hardware_key, cand.backend, nodes, time.monotonic() - first
            )
        return built

    def tune(self, program: ExportedProgram, progress: Progress | None = None) -> TuneOutcome:
        started = time.monotonic()
        say = progress or (lambda _f, _m: None)
        # The fingerprint of the program as exported (deployments compute it on theirs), then
        # the program itself on the device: torch.export's pass also moves devices baked into
        # the graph, where `module.to()` would leave them on the CPU. The caller's program moves.
        fingerprint = graph_fingerprint(to_graph_module(program))
        if self.device.kind != "cpu":
            program = on_device(program, self.device.torch_device)
        captured = self._capture(program, say)
        self.model_time_s = self._model_time_s(captured)
        # The peers are the floor, so they are built and timed first, with the whole budget;
        # unless even the quickest is not expected to fit: then the passes go first (eager needs
        # no compile) and the peers get what is left, and the report says so.
        peers = self._peer_candidates(captured)
        first = self._peers_fit(peers, started, say)
        self.peers_late = not first
        early = peers if first else self._affordable_stand_in(captured, started, say)
        figures = self._judge_all(captured, early, started, say, (0.05, 0.3))
        deadline = self._search_deadline(started, early, figures)
        search = self._search(captured, started, say, deadline)
        known = {_identity(c) for c in peers + early}
        rest = self._candidates(captured.gm, captured.inputs, search.steps, self._passes())
        rest = [c for c in rest if _identity(c) not in known]
        rest += self._size_candidates(captured, search, peers + early + rest)
        figures += self._judge_all(captured, rest, started, say, (0.6, 0.85))
        if first:
            candidates = peers + rest
        else:
            figures += self._judge_all(captured, peers, started, say, (0.8, 0.85))
            candidates = early + rest + peers
        self.candidates = candidates
        chosen_fig, chosen = self._choose(captured, candidates, figures)
        say(0.85, "verifying")
        verified = self._verify(program, captured, chosen_fig, chosen)
        try:
            bucketed = self._bucketed(program, captured, candidates, figures, chosen_fig.name)
        except Exception as exc:  # buckets only refine a verified decision: keep that one
            failure = failures.fallback(exc, "size buckets")
            bucketed = _Bucketed(note=f"not bucketed: {failure.type}: {failure.message[:300]}")
        if bucketed.outcomes:
            verified = bucketed.headline
        config = self._config(fingerprint, captured, search, figures, verified, started)
        config.buckets = [b.bucket for b in bucketed.outcomes]
        if bucketed.note:
            config.tuning["buckets"] = bucketed.note
        say(0.9, "tuning done")
        inductor = config.backend == "inductor"
        nodes = len(verified.replay.gm.graph.nodes)
        return TuneOutcome(
            config,
            program,
            verified.replay,
            verified.runner,
            self.samples,
            verified.candidate.package if inductor else None,
            list(self.points),
            deadline=started + self.options.budget_s,
            twin_estimate_s=(
                self.compile_times.estimate(self.hardware_key, "inductor", nodes)
                if inductor
                else None
            ),
            buckets=bucketed.outcomes,
            dispatch=bucketed.dispatch,
        )

    def _passes(self) -> list[str]:
        return self.options.passes or pass_names()

    def _capture(self, program: ExportedProgram, say: Progress) -> _Captured:
        say(0.0, "capturing graph")
        gm0 = to_graph_module(program).to(self.device.torch_device)
        inputs = tuple(to_device(x, self.device) for x in example_inputs(program))
        spec = spec_of(gm0)
        skipped: list[str] = []
        if spec is not None:
            say(0.02, "choosing sizes")
            points, skipped = size_points(spec, inputs, self.options.sizes, lambda a: gm0(*a))
            self.points = [
                SizePoint(p.label, p.sizes, tuple(to_device(x, self.device) for x in p.inputs))
                for p in points
            ]
        return _Captured(gm0, inputs, spec, skipped)

    def _search(
        self, captured: _Captured, started: float, say: Progress, deadline: float
    ) -> SearchResult:
        settings = SearchSettings(
            device=self.device,
            hardware_key=self.hardware_key,
            deadline=deadline,
            site_budget_s=self.options.site_budget_s,
            epsilon=self.options.epsilon,
            passes=self._passes(),
            points=self.points if len(self.points) > 1 else [],
            model_time_s=self.model_time_s,
            run=SITE_RUNS[self.options.mode],
            noise_share=NOISE_SHARE * self.options.epsilon,
        )
        search = SiteSearch(settings, self.cache).run(
            copy.deepcopy(captured.gm), captured.inputs, lambda f, m: say(0.3 + 0.3 * f, m)
        )
        self.samples.update(search.samples)
        self.timed += search.timed
        return search

    def _peer_candidates(self, captured: _Captured) -> list[Candidate]:
        """The untouched program under each backend a user would pick instead of fxtune (the
        candidates that carry no passes)."""
        every = self._candidates(captured.gm, captured.inputs, [], [])
        return [c for c in every if not c.passes and c.backend != "eager"]

    def _peers_fit(self, peers: list[Candidate], started: float, say: Progress) -> bool:
        """Whether the peers go first: say before starting what their compiles are expected to
        cost (this machine's history, else a prior) and, where even the quickest is not expected
        to fit, the budget it would need. Nothing slower than what is measured ships either way.
        """
        left = self._remaining(started)
        check = CHECK_CALLS * (self.model_time_s or 0.0) + MIN_TIMING_S
        estimates: dict[str, float] = {}
        for cand in peers:
            if cand.backend not in backends.COMPILING:
                continue
            nodes = len(cand.transformed.gm.graph.nodes)
            estimate, measured = self.compile_times.planning_estimate(
                self.hardware_key, cand.backend, nodes
            )
            estimates[cand.backend] = estimate
            source = "from this machine's compiles" if measured else "nothing measured here yet"
            self.peer_notes.append(
                f"{cand.backend}: compile estimated at {estimate:.0f} s ({source})"
            )
        fits = not estimates or min(estimates.values()) + check <= left
        if fits:
            self.peer_notes.append(f"the peers go first, with the {left:.0f} s left for tuning")
        else:
            quickest = min(estimates, key=estimates.__getitem__)
            needed = (estimates[quickest] + check) / (1 - FINISH_SHARE)
            self.peer_notes.append(
                f"no peer is expected to fit: {quickest} needs about {estimates[quickest]:.0f} s "
                f"and {left:.0f} s are left for tuning; a budget of about {needed:.0f} s would "
                "build and time it. The passes go first and the peers get what is left"
            )
        for note in self.peer_notes:
            say(0.05, f"peers: {note}")
        return fits

    def _affordable_stand_in(
        self, captured: _Captured, started: float, say: Progress
    ) -> list[Candidate]:
        """When no peer is expected to fit: the quickest compiled candidate that is, the
        original with every pass under a peer's backend (it needs no search, and the passes
        shrink the graph, so it compiles sooner), built first while the budget is whole."""
        left = self._remaining(started)
        check = CHECK_CALLS * (self.model_time_s or 0.0) + MIN_TIMING_S
        every = self._candidates(captured.gm, captured.inputs, [], self._passes())
        priced: list[tuple[float, Candidate]] = []
        for cand in every:
            if not cand.passes or cand.backend not in backends.PEERS:
                continue
            if cand.backend not in backends.COMPILING:
                continue
            nodes = len(cand.transformed.gm.graph.nodes)
            estimate, _ = self.compile_times.planning_estimate(
                self.hardware_key, cand.backend, nodes
            )
            if estimate + check <= left:
                priced.append((estimate, cand))
        if not priced:
            return []
        # A tie goes to a backend built in a child, which is stopped if it overruns.
        estimate, cand = min(priced, key=lambda ec: (ec[0], ec[1].backend not in STOPPABLE))
        nodes = len(cand.transformed.gm.graph.nodes)
        note = f"{cand.name} ({nodes} nodes) is expected to fit ({estimate:.0f} s): it goes first"
        self.peer_notes.append(note)
        say(0.05, f"peers: {note}")
        return [cand]

    def _search_deadline(
        self, started: float, peers: list[Candidate], figures: list[Figures]
    ) -> float:
        """When the site search stops: half of what the peers left, and never so late that the
        passes cannot be built under the fastest peer's backend (its compile, measured just now,
        plus checking and timing it)."""
        left = max(self._remaining(started), 0.0)
        faster = [
            (f.speedup or 0.0, c)
            for c, f in zip(peers, figures, strict=True)
            if f.verdict == "faster"
        ]
        best = max(faster, key=lambda sc: sc[0])[1] if faster else None
        reserve = 0.5 * left
        if best is not None and best.backend in backends.COMPILING:
            nodes = len(best.transformed.gm.graph.nodes)
            estimate = self.compile_times.estimate(self.hardware_key, best.backend, nodes) or 0.0
            check = CHECK_CALLS * (self.model_time_s or 0.0) + MIN_TIMING_S
            reserve = max(reserve, estimate + check + self.options.whole_model_budget_s)
        return time.monotonic() + max(left - reserve, 0.0)

    def _model_time_s(self, captured: _Captured) -> float | None:
        """The whole model's seconds per call, bounding any site's (CPU; None elsewhere)."""
        if self.device.kind != "cpu":
            return None
        with fixed_threads(self.options.threads):
            return quick_per_call_s(lambda: captured.gm(*captured.inputs))

    def _judge_all(
        self,
        captured: _Captured,
        candidates: list[Candidate],
        started: float,
        say: Progress,
        span: tuple[float, float],
    ) -> list[Figures]:
        figures: list[Figures] = []
        low, high = span
        for i, cand in enumerate(candidates):
            done = low + (high - low) * i / max(len(candidates), 1)
            say(done, f"timing whole model: {cand.name}")
            figures.append(self._judge(captured.gm, captured.inputs, cand, started))
        return figures

    def _choose(
        self, captured: _Captured, candidates: list[Candidate], figures: list[Figures]
    ) -> tuple[Figures, Candidate]:
        """The fastest candidate whose interval clears 1 + epsilon; else the original.

        The best peer is the floor: a candidate with passes replaces it only when its interval
        lies above the peer's speedup. Each was timed against the original, not against the
        other, so a tie by point estimate is noise, and in a tie the user's own pick ships.
        """
        winners = [
            (f, c) for f, c in zip(figures, candidates, strict=True) if f.verdict == "faster"
        ]
        if winners:
            best = max(winners, key=lambda fc: fc[0].speedup or 0.0)
            plain = [(f, c) for f, c in winners if not c.passes and c.backend in backends.PEERS]
            if not plain:
                return best
            peer = max(plain, key=lambda fc: fc[0].speedup or 0.0)
            low = best[0].ci[0] if best[0].ci else None
            if best[1] is peer[1] or (low is not None and low > (peer[0].speedup or 0.0)):
                return best
            self.peer_notes.append(
                f"{best[1].name} measured {best[0].speedup:.3f}x and {peer[1].name} "
                f"{peer[0].speedup:.3f}x over the original: within each other's noise, so "
                f"the peer ships"
            )
            return peer
        return _original(
            captured,
            "within noise",
            "no candidate was faster than the original beyond noise; the original stands",
        )

    def _verify(
        self, program: ExportedProgram, captured: _Captured, fig: Figures, chosen: Candidate
    ) -> _Verified:
        """The config replayed from the original (eager) and the chosen runner must both match
        the original, at the example's size and every further size tuned at; else the original
        ships, with the reason."""
        gm0, inputs = captured.gm, captured.inputs
        if chosen.name == "original":  # nothing was changed, so there is nothing to verify
            verification = Verification(
                inputs=0,
                max_abs_error=0.0,
                max_rel_error=0.0,
                passed=True,
                reason="the original program stands: nothing to verify",
            )
            return _Verified(fig, chosen, Transformed(gm0, inputs), gm0, verification)
        trials = fresh_inputs(inputs, 3, seed=1234)
        for point in self.points[1:]:
            trials += fresh_inputs(point.inputs, 1, seed=1234)
        replay, runner, verification = self._replayed_and_checked(program, gm0, chosen, trials)
        wrong = verification.reason
        if wrong is not None:
            reason = f"the tuned module failed verification ({wrong}); the original stands"
            fig, chosen = _original(captured, "wrong outputs", reason)
            replay, runner = Transformed(gm0, inputs), gm0
        return _Verified(fig, chosen, replay, runner, verification)

    def _replayed_and_checked(
        self, program: ExportedProgram, gm0: fx.GraphModule, cand: Candidate, trials: list[Inputs]
    ) -> tuple[Transformed, Callable[..., Any], Verification]:
        """`cand` replayed from the original (what `apply_config` gives) and its runner, both
        checked against `gm0` on `trials`; the reason is why they differ, None when they agree."""
        replay = replay_steps(program, cand.passes)
        replay.gm.to(self.device.torch_device)
        runner = cand.runner if cand.runner is not None else replay.gm
        wrong = check_outputs(gm0, lambda *a: replay.gm(*replay.pack(a)), trials)
        if wrong is None:
            wrong = check_outputs(gm0, lambda *a: runner(*replay.pack(a)), trials)
        abs_err, rel_err = output_errors(gm0, lambda *a: runner(*replay.pack(a)), trials)
        check = Verification(
            inputs=len(trials),
            max_abs_error=abs_err,
            max_rel_error=rel_err,
            passed=wrong is None,
            reason=wrong,
        )
        return replay, runner, check

    def _bucketed(
        self,
        program: ExportedProgram,
        captured: _Captured,
        candidates: list[Candidate],
        figures: list[Figures],
        chosen: str,
    ) -> _Bucketed:
        """Size buckets where the per-size winners differ (`tuner.search.buckets`), each verified at
        the sizes measured inside it, and the dispatching program built and checked at every
        size; any failure leaves one decision set for every size (the note says why)."""
        if len(self.points) < 2:
            return _Bucketed()
        if bucket_dim(captured.spec, self.points) is None:
            return _Bucketed(note="not bucketed: the sizes measured vary along several dims")
        plans = plan_buckets(captured.spec, self.points, figures, chosen)
        if not plans:
            return _Bucketed(note="one decision for every size measured")
        by_name = {c.name: (c, f) for c, f in zip(candidates, figures, strict=True)}
        if any(by_name[p.winner][0].transformed.packers for p in plans if p.winner != ORIGINAL):
            return _Bucketed(note="not bucketed: a bucket's winner changes the inputs")
        outcomes: list[BucketOutcome] = []
        checks: list[Verification] = []
        for plan in plans:
            outcome, check = self._verify_bucket(program, captured, plan, by_name)
            outcomes.append(outcome)
            checks.append(check)
        trials = [p.inputs for p in self.points]
        try:
            dispatch = dispatching_program(
                [o.bucket for o in outcomes], [o.tuned.gm for o in outcomes], captured.inputs
            )
            wrong = check_outputs(captured.gm, dispatch.module(), trials)
        except Exception as exc:
            failure = failures.fallback(exc, "the dispatching program")
            wrong = f"{failure.type}: {failure.message[:300]}"
        if wrong is not None:
            return _Bucketed(note=f"not bucketed: the dispatching program failed ({wrong})")
        example = captured.spec.sizes_of(captured.inputs) if captured.spec else {}
        head = next(o for o in outcomes if o.bucket.contains(example[o.bucket.dim]))
        name = head.bucket.name
        if name == ORIGINAL:
            fig, cand = _original(captured, "within noise", head.bucket.reason or "")
        else:
            cand, fig = by_name[name]
            # Its verdict over the sizes it serves: elsewhere another bucket's decision runs.
            verdict_, _ = combined_verdict(head.bucket.per_size)
            why = f"the decision for {head.bucket.describe()}, one of {len(outcomes)} size buckets"
            fig = fig.model_copy(update={"verdict": verdict_, "reason": why})
        passed = all(c.passed for c in checks)
        verification = Verification(
            inputs=sum(c.inputs for c in checks),
            max_abs_error=max((c.max_abs_error or 0.0) for c in checks),
            max_rel_error=max((c.max_rel_error or 0.0) for c in checks),
            passed=passed,
            reason=None if passed else "; ".join(c.reason for c in checks if c.reason),
        )
        headline = _Verified(fig, cand, head.tuned, head.runner, verification)
        labels = ", ".join(f"{o.bucket.describe()}: {o.bucket.name}" for o in outcomes)
        return _Bucketed(outcomes, headline, dispatch, f"{len(outcomes)} buckets ({labels})")

    def _verify_bucket(
        self,
        program: ExportedProgram,
        captured: _Captured,
        plan: Plan,
        by_name: dict[str, tuple[Candidate, Figures]],
    ) -> tuple[BucketOutcome, Verification]:
        """A bucket's decision replayed from the original and its runner, both checked at the
        sizes measured inside the bucket; a bucket that fails runs the original instead."""
        if plan.winner == ORIGINAL:
            replay = Transformed(copy.deepcopy(captured.gm), captured.inputs)
            check = Verification(inputs=0, max_abs_error=0.0, max_rel_error=0.0, passed=True)
            return BucketOutcome(to_bucket(plan, None), replay, captured.gm), check
        cand, fig = by_name[plan.winner]
        trials = [t for p in plan.points for t in fresh_inputs(p.inputs, 2, seed=4321)]
        gm0 = captured.gm
        replay, runner, check = self._replayed_and_checked(program, gm0, cand, trials)
        wrong = check.reason
        if wrong is not None:
            check = check.model_copy(
                update={"reason": f"{plan.winner} at {plan.measured}: {wrong}"}
            )
            original = dataclasses.replace(plan, winner=ORIGINAL)
            bucket = to_bucket(original, None)
            bucket.reason = f"{plan.winner} failed verification ({wrong}); the original runs here"
            replay = Transformed(copy.deepcopy(gm0), captured.inputs)
            return BucketOutcome(bucket, replay, gm0), check
        package = cand.package if cand.backend == "inductor" else None
        return BucketOutcome(to_bucket(plan, fig), replay, runner, package), check

    def _config(
        self,
        fingerprint: str,
        captured: _Captured,
        search: SearchResult,
        figures: list[Figures],
        verified: _Verified,
        started: float,
    ) -> TunedConfig:
        chosen = verified.candidate
        return TunedConfig(
            model_fingerprint=fingerprint,
            hardware=self.hardware,
            backend=chosen.backend,
            passes=chosen.passes,
            changes_inputs=bool(chosen.transformed.packers),
            sites=search.decisions,
            candidates=figures,
            whole_model=verified.figures,
            verification=verified.verification,
            tuning={
                "seconds": round(time.monotonic() - started, 2),
                "budget_s": self.options.budget_s,
                "timed_candidates": self.timed,
                "cache_hits": self.cache.hits,
                "sites_found": sum(len(s.sites) for s in search.every_site),
                "site_counts": search.counts(),
                "peers": self.peer_notes,
                "epsilon": self.options.epsilon,
                "sizes": [{"label": p.label, "sizes": p.sizes} for p in self.points],
                "sizes_skipped": captured.skipped,
            },
            shapes=captured.spec.to_dict() if captured.spec is not None else {},
            refusals=search.refusals,
        )


@dataclass
class _Bucketed:
    """The buckets that ship (none: one decision set), the example bucket's decision as the
    headline, the dispatching program, and a note for the config saying what happened."""

    outcomes: list[BucketOutcome] = field(default_factory=list)
    headline: Any = None  # _Verified when there are buckets
    dispatch: ExportedProgram | None = None
    note: str = ""


def _identity(cand: Candidate) -> tuple[str, tuple[tuple[str, tuple[str, ...]], ...]]:
    """A candidate's backend and passes: two candidates with the same build the same runner."""
    return cand.backend, tuple((s.pass_name, tuple(s.sites)) for s in cand.passes)


def _original(captured: _Captured, verdict_: str, reason: str) -> tuple[Figures, Candidate]:
    fig = Figures(name="original", backend="eager", passes=[], verdict=verdict_, reason=reason)
    gm0 = captured.gm
    return fig, Candidate("original", "eager", [], Transformed(gm0, captured.inputs), gm0)


def _steps_from_decisions(decisions: list[SiteDecision], label: str) -> list[PassStep]:
    """The sites kept by the never-worse rule, plus those faster beyond noise at `label` and
    right (not "wrong outputs", not "failed to run") at every size; in the search's order."""
    steps: list[PassStep] = []
    for d in decisions:
        at = next((f for f in d.per_size if f.label == label), None)
        wrong = any(f.verdict in ("wrong outputs", "failed to run") for f in d.per_size)
        if not (d.accepted or (at is not None and at.verdict == "faster" and not wrong)):
            continue
        if steps and steps[-1].pass_name == d.pass_name:
            steps[-1].sites.append(d.site_id)
        else:
            steps.append(PassStep(pass_name=d.pass_name, sites=[d.site_id]))
    for step in steps:
        step.sites.sort()
    return steps


def _steps_from_sites(sites: list[Site]) -> list[PassStep]:
    """Consecutive sites of one pass become one step, in the order they were applied."""
    steps: list[PassStep] = []
    for site in sites:
        if steps and steps[-1].pass_name == site.pass_name:
            if site.id not in steps[-1].sites:
                steps[-1].sites.append(site.id)
        else:
            steps.append(PassStep(pass_name=site.pass_name, sites=[site.id]))
    for step in steps:
        step.sites.sort()
    return steps


def _train_tuner() -> type[Tuner]:
    from tuner.tuning.train import TrainTuner  # it builds on this module

    return TrainTuner


# What each mode tunes: the forward (this module) or a training step (tuner.tuning.train).
TUNERS: dict[str, Callable[[], type[Tuner]]] = {"infer": lambda: Tuner, "train": _train_tuner}


def tuner_for(mode: str) -> type[Tuner]:
    return TUNERS[mode]()


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
        outcome = tuner_for(session.mode)(session).tune(program, progress)
    outcome.config.tuning["errors"] = fell_back.to_list()
    if options.workdir is None:
        outcome.package = None
    return outcome
