"""Spending a run's time budget: what is started, in which order, and when the search stops.

Nothing is started that is not expected to finish: a candidate whose output check alone would
overrun, or whose compile is estimated beyond what is left, is recorded as skipped, with why.
The peers (`tuner.backends.registry.PEERS`) are the floor, so they go first unless even the
quickest is not expected to fit; then a cheaper stand-in goes first and the peers get what is
left. Compile estimates come from this machine's history (`tuner.backends.compile_time`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tuner.backends import registry as backends
from tuner.backends.runtimes import is_runtime
from tuner.contract.config import Figures, Verdict
from tuner.graph.capture import Inputs
from tuner.graph.sizes import SizePoint
from tuner.measure.timing import (
    POOLED,
    Blocks,
    fixed_threads,
    planned_round,
    process_clock_step_ns,
    steady_per_call_s,
)
from tuner.search.site_search import Progress
from tuner.tuning.candidates import Candidate
from tuner.tuning.run import FINISH_SHARE, Captured, TuningRun
from tuner.tuning.step_kind import StepKind

# A compile is started only if its estimate leaves this much of the budget for timing it.
MIN_TIMING_S = 2.0
# Model calls checking a candidate's outputs makes per distinct input set it runs on, where
# the run has not made the reference's outputs there yet: the reference twice, its float64
# twin (2.0-3.0x a call on one thread here: bert_mini 2.0x, distilbert at batch 64 2.1x,
# resnet18 3.0x) and the candidate once, rounded up. Where the run has made them (its
# `ReferenceMemo`), the candidate's call, doubled for a call slower than the one measured.
# Planned as three sets to make where the inputs are not known; a text model's integer inputs
# are one set, not three (`distinct_inputs`): planned as three, its checks at batch 64
# beside two busy processes read 40 s where they take about 15.
NEW_SET_CALLS = 7
KNOWN_SET_CALLS = 2
UNKNOWN_SETS = 3
# With nothing measured, the prior is all there is. A compile in the tuner's own process, which
# nothing can stop, is planned and started as taking half as long again as its prior
# (ResNet-18's torch.compile took 1.3x its prior here); one in a child, stopped if it overruns,
# is planned with its prior but started where half of it fits (a machine twice as fast as the
# one the prior was measured on still builds its peers).
IN_PROCESS_MARGIN = 1.5
STOPPABLE_SHARE = 0.5
# Calls of the original and of a candidate, together, that a comparison at a further size needs
# where calls are slow (each: warm-up calls for up to a quarter of its budget, one calibration
# call, 8 rounds of one call: `tuner.measure.timing.run_rounds`): with the whole-model budget
# alone, a size whose calls take a second fitted no round (distilbert_dyn at batch 64 beside two
# busy processes: every candidate "not measured" there, and the original shipped). Calls a
# fifth slower than the one measured still fit six rounds, what the interval needs. A runtime's
# blocks add their pauses (`POOLED`) to each round.
SIZE_CALLS = 24
LEAST_ROUNDS = 8
# A head-to-head (`Judge.runoff`) gets up to this many whole-model timings.
RUNOFF_SPAN = 3
# Compiles made in a child process that is stopped when it overruns (tuner.backends.isolation):
# AOTInductor's, and the runtimes' artifacts.
STOPPABLE = backends.CHILD_BUILT
# Per device kind, the peer expected to run fastest: when the peers cannot all go first, it goes
# first (alone if need be) where this machine's history says its build fits, instead of the
# quickest build. On a CPU, AOTInductor runs Inductor's kernels without torch.compile's guards:
# at or above torch.compile on all twelve zoo models at 300 s here (1.00-1.75x,
# the zoo's 300 s run of 2026-11-26, in git history of bench/out/), where at 60 s torch.compile
# went first and AOTInductor never fitted after it.
# Not where a runtime is a peer: built in 2-6 s, OpenVINO or ONNX Runtime was the fastest peer on
# 9 of the 12 zoo models at 60 s, and AOTInductor going first left them out (albert_small: its
# package shipped at 0.81x of OpenVINO, which was never built).
FASTEST_PEER: dict[str, str] = {"cpu": "inductor"}


class Budget:
    """The run's clock and compile estimates, asked before anything costly is started."""

    def __init__(self, run: TuningRun, kind: StepKind) -> None:
        self.run = run
        self.kind = kind  # it estimates its compiles and says what its checks run on
        self.example: Inputs | None = None  # the example's inputs, once `read_original` ran
        self._trials: dict[int, tuple[Inputs, list[Inputs]]] = {}

    def read_original(self, baseline: Callable[..., object], captured: Captured) -> None:
        """The original's seconds per timed call (`run.model_time_s`), bounding the checks and
        any site's time (CPU; None elsewhere), and the inputs its checks are planned on; and
        its call at each further size (`_size_call_s`). Read before the run starts any child:
        read while the runtimes' serving child imported, recsys_dyn's call at batch 4096 took
        18-134 ms where it takes 9-11 ms, and a zoo run kept 25 s of its 60 for that size
        (4 s in the runs before and after), so AOTInductor did not fit and the original
        shipped, 0.47x of it."""
        run = self.run
        self.example = captured.inputs
        if run.device.kind != "cpu":
            run.model_time_s = None
            return
        with fixed_threads(run.options.threads):
            run.model_time_s = steady_per_call_s(lambda: baseline(*captured.inputs))
        for point in run.points[1:]:
            self._size_call_s(baseline, point)

    def check_calls(self, inputs: Inputs | None) -> int:
        """Model calls checking one candidate's outputs on `inputs` makes: per distinct input
        set its check runs on, NEW_SET_CALLS where the run has no reference outputs there yet,
        else KNOWN_SET_CALLS (UNKNOWN_SETS new ones where `inputs` or the kind are not known)."""
        if inputs is None or self.kind is None:
            return UNKNOWN_SETS * NEW_SET_CALLS
        if id(inputs) not in self._trials:  # kept with its inputs: the id stays theirs
            self._trials[id(inputs)] = (inputs, self.kind.check_trials(inputs))
        trials = self._trials[id(inputs)][1]
        memo = self.run.references
        known = sum(1 for t in trials if memo is not None and memo.knows(t))
        return NEW_SET_CALLS * (len(trials) - known) + KNOWN_SET_CALLS * known

    def check_s(self) -> float:
        """Seconds checking one candidate's outputs at the example's size and its least
        timing take: what starting one needs besides its build."""
        return self._example_check_s() + MIN_TIMING_S

    def _example_check_s(self) -> float:
        """Seconds checking one candidate's outputs at the example's size takes."""
        return self.check_calls(self.example) * (self.run.model_time_s or 0.0)

    def peer_s(self) -> float:
        """Seconds one peer's check and least timing take besides its build, as the peers are
        planned (`plan_peers`): a runtime's rounds are blocks with pauses (`least_timing_s`),
        4-5 s for eight on the zoo's CNNs where `check_s` counts 2 (efficientnet_b0 at 60 s:
        three builds planned to leave 6 s, and four variants fitted 5 rounds in the 8 s left)."""
        return self._example_check_s() + self.least_timing_s(self.run.model_time_s or 0.0)

    def _nodes(self, cand: Candidate) -> int:
        return len(cand.transformed.gm.graph.nodes)

    def _size_call_s(self, baseline: Callable[..., object], point: SizePoint) -> float:
        """The original's seconds per call at a further size (CPU: measured once per size and
        run; 0 elsewhere), read as the checks' reference outputs there are made where the kind
        keeps them: distilbert_dyn at batch 64 beside two busy processes spent 3.4 s on calls
        that only measured it, and the first check there made the same calls again."""
        run = self.run
        if run.device.kind == "cpu" and point.label not in run.size_time_s:
            with fixed_threads(run.options.threads):
                made = self.kind.reference_call_s(baseline, point.inputs) if self.kind else None
                run.size_time_s[point.label] = (
                    made if made is not None else steady_per_call_s(lambda: baseline(*point.inputs))
                )
        return run.size_time_s.get(point.label, 0.0)

    def least_timing_s(self, call_s: float) -> float:
        """The least seconds a comparison whose original takes `call_s` a call is given: the
        calls of an interval (`SIZE_CALLS`), and on a CPU a runtime's pauses between blocks."""
        pooled = self.run.device.kind == "cpu"  # the runtimes are CPU backends
        pauses = LEAST_ROUNDS * POOLED.pauses_per_round(2) if pooled else 0.0
        return max(MIN_TIMING_S, SIZE_CALLS * call_s) + pauses

    def size_least_s(self, baseline: Callable[..., object], point: SizePoint) -> float:
        """The least seconds checking and comparing one candidate at a further size takes
        for a verdict: its check and `least_timing_s`."""
        call_s = self._size_call_s(baseline, point)
        return self.least_timing_s(call_s) + self.size_check_s(point)

    def size_check_s(self, point: SizePoint) -> float:
        """Seconds checking a candidate's outputs at a further size can take (`check_calls`:
        the first candidate checked there makes the reference's outputs, in float64 too),
        from the original's calls there (`size_least_s` measures them first)."""
        return self.check_calls(point.inputs) * self.run.size_time_s.get(point.label, 0.0)

    def further_sizes_s(self, baseline: Callable[..., object]) -> float:
        """The least seconds one candidate's checks and comparisons at the sizes after the
        example's take (`size_least_s`; the original's calls there as `read_original` read
        them, else now, once per run): what is kept for them before anything else is
        started."""
        run = self.run
        if run.remaining() < MIN_TIMING_S:  # nothing fits: nothing kept, no calls made here
            return 0.0
        return sum(self.size_least_s(baseline, p) for p in run.points[1:])

    def timing_s(self, baseline: Callable[..., object], i: int) -> float | None:
        """Seconds for a candidate's comparison at the run's `i`-th size, its check there paid:
        the whole-model budget, or at a further size what its rounds need where calls there
        are slow (`least_timing_s`), less what the sizes after it need (`size_least_s`), but
        never below the least (distilbert_dyn at 60 s beside two busy processes: OpenVINO's
        comparisons at batch 4 and 2 took the whole-model budget each, and batch 64 was left
        3 s short). None for a program tuned at one size: the whole-model budget."""
        run = self.run
        if len(run.points) <= 1:
            return None
        if i == 0:
            call_s = run.model_time_s or 0.0
            check = self._example_check_s()
            wanted = run.timing_budget()
        else:
            call_s = run.size_time_s.get(run.points[i].label, 0.0)
            check = self.size_check_s(run.points[i])
            wanted = max(run.options.whole_model_budget_s, self.least_timing_s(call_s))
        keep = sum(self.size_least_s(baseline, p) for p in run.points[i + 1 :])
        least = min(self.least_timing_s(call_s), wanted)
        return max(least, min(wanted, run.remaining() - check - keep))

    def together_s(self, baseline: Callable[..., object], candidates: int) -> float:
        """Seconds for timing `candidates` and the original in the same rounds at the
        example's size (`Judge.peers`): a comparison's (`timing_s`) for every two variants'
        calls, within what a check and the further sizes leave (recsys_dyn at 60 s, given all
        but the further sizes' least: its fastest peer then found that least a hair short at
        batch 4096, and the original shipped, 0.48x of it), never below one comparison's."""
        run = self.run
        one = self.timing_s(baseline, 0) or run.timing_budget()
        keep = sum(self.size_least_s(baseline, p) for p in run.points[1:])
        return max(one, min(one * (candidates + 1) / 2, run.remaining() - self.check_s() - keep))

    def together_fits(self, call_s: list[float], blocks: Blocks, budget_s: float) -> bool:
        """Whether variants whose calls take `call_s` (the original's first) fit LEAST_ROUNDS
        rounds together in `budget_s`, with their warm-up and calibration (about seven calls
        each): efficientnet_b0 at 60 s timed its three peers and the original together in 8 s,
        fitted 5 rounds, too few for an interval, and the original shipped, 0.39x of ONNX
        Runtime."""
        cap = budget_s / (2 * LEAST_ROUNDS)  # as `run_rounds` caps a round's calls
        _, round_s, _ = planned_round(call_s, blocks=blocks, round_cap_s=cap)
        return (LEAST_ROUNDS + 1) * round_s + 7 * sum(call_s) <= budget_s

    def check_wont_fit(self, left: float) -> str | None:
        """Why a candidate is not started: checking its outputs alone would overrun."""
        if self.run.model_time_s is None:
            return None
        needed = self.check_s()
        if needed <= left:
            return None
        return (
            f"skipped: checking its outputs and timing it need about {needed:.0f} s "
            f"and {left:.0f} s of the time budget are left"
        )

    def _planned(self, cand: Candidate) -> float:
        """The seconds to plan a compile with: its measured estimate, else its prior (with
        `IN_PROCESS_MARGIN` where nothing could stop it)."""
        run = self.run
        nodes = self._nodes(cand)
        estimate, measured = run.compile_times.planning_estimate(
            run.hardware_key, cand.backend, nodes
        )
        if measured or cand.backend in STOPPABLE:
            return estimate
        return IN_PROCESS_MARGIN * estimate

    def cheapest_first(self, cands: list[Candidate]) -> list[Candidate]:
        """`cands` with those that build in seconds first (eager: no build; a runtime's artifact:
        2-6 s on the zoo's models here) and the compilers' (AOTInductor's 10-30 s) after them,
        each group in its own order (the searched passes before every pass), so a short budget
        is spent on what it can finish."""
        slow = [c.backend in backends.COMPILING and not is_runtime(c.backend) for c in cands]
        return [c for c, s in zip(cands, slow, strict=True) if not s] + [
            c for c, s in zip(cands, slow, strict=True) if s
        ]

    def runoff_s(self, left: float) -> float | None:
        """Seconds for a head-to-head between the two candidates the choice hinges on
        (`Judge.runoff`), leaving twice a check for verifying what ships; None where the least
        timing does not fit. Up to RUNOFF_SPAN whole-model timings: the two may be as close
        as their comparisons against the original could not tell apart."""
        spare = left - 2 * self.check_s()
        if spare < MIN_TIMING_S:
            return None
        return min(RUNOFF_SPAN * self.run.options.whole_model_budget_s, spare)

    def build_timeout(self, left: float) -> float:
        """Seconds a build may take: what is left once its outputs are checked and timed."""
        return max(left - self.check_s(), 1.0)

    def compile_wont_fit(self, cand: Candidate, left: float) -> str | None:
        """Why a compile is not started (its estimate exceeds what is left), or None."""
        if cand.backend not in backends.COMPILING:
            return None
        estimate = self.kind.compile_estimate(cand)
        nodes = self._nodes(cand)
        if estimate is None:
            prior = self._planned(cand)
            bar = _started_at(cand.backend, prior, measured=False)
            if bar <= left - MIN_TIMING_S:
                return None
            return (
                f"skipped: nothing measured here yet, {self.kind.compiling} is expected to take "
                f"about {prior:.0f} s ({nodes} nodes) and {left:.0f} s of the time budget are left"
            )
        if estimate <= left - MIN_TIMING_S:
            return None
        return (
            f"skipped: {self.kind.compiling} is estimated at {estimate:.0f} s ({nodes} nodes) "
            f"and {left:.0f} s of the time budget are left"
        )

    def plan_peers(
        self,
        peers: list[Candidate],
        say: Progress,
        baseline: Callable[..., object] | None = None,
    ) -> tuple[list[Candidate], list[Candidate]]:
        """(first, last): the peers built and timed before the site search, quickest first,
        as long as their compiles are expected to fit together, with, where the run tunes at
        several sizes (and `baseline`, the original, is given), the least time one of them
        needs at the other sizes kept aside (`further_sizes_s`; distilbert_dyn at 60 s: three
        peers built, then 7 s left where OpenVINO's comparison at batch 64 needed 16, and the
        original shipped, 0.73x of OpenVINO); the rest after it, with what is left. Says before
        starting what each compile is expected to cost (this machine's history, else a prior,
        scaled by the load) and, where no peer is expected to fit, the budget it would need.
        Nothing slower than what is measured ships either way."""
        run = self.run
        kept = 0.0
        if baseline is not None and len(run.points) > 1:
            kept = self.further_sizes_s(baseline)
            run.peer_notes.append(
                f"{kept:.0f} s kept for checking and timing one candidate at the "
                f"{len(run.points) - 1} other sizes"
            )
        left = run.remaining() - kept  # after the calls that measured it
        if run.load.shared:
            timed = (
                "timed by this process's CPU time, which the other work does not stretch"
                if run.clock == "cpu"
                else "timings are noisier"
            )
            if run.clock == "wall" and run.hardware["threads"] == 1 and run.device.kind == "cpu":
                step = (process_clock_step_ns() or 0) / 1e6
                timed += (
                    f" (this process's CPU clock moves in {step:.0f} ms steps, as it does under "
                    "a CPU-time limit: too coarse to time calls, so the wall clock times them)"
                )
            run.peer_notes.append(
                f"{run.load.describe()}: tuning on {run.hardware['threads']} of "
                f"{run.load.cores} threads, {run.load.describe_compiles()}, and {timed}"
            )
        estimates: dict[str, float] = {}
        measured_here: set[str] = set()
        for cand in peers:
            if cand.backend not in backends.COMPILING:
                continue
            estimate, measured = run.compile_times.planning_estimate(
                run.hardware_key, cand.backend, self._nodes(cand)
            )
            estimates[cand.backend] = estimate
            if measured:
                measured_here.add(cand.backend)
            source = "from this machine's compiles" if measured else "nothing measured here yet"
            note = f"{cand.backend}: compile estimated at {estimate:.0f} s ({source})"
            run.peer_notes.append(note)
        planned = {c.backend: self._planned(c) for c in peers if c.backend in estimates}
        # Grouped by what starting each needs (`compile_wont_fit`): a build in a child with
        # nothing measured starts where STOPPABLE_SHARE of its prior fits. Grouped by the whole
        # prior, recsys_dyn's first run at 60 s put AOTInductor (prior 23 s, built in 20) after
        # the runtimes and the passes, where it never fitted: 0.56x of it shipped.
        starts = {b: _started_at(b, s, b in measured_here) for b, s in planned.items()}
        first, last = self._quickest_first(peers, planned, starts, left, [])
        fastest = self._fastest_that_fits(last, planned, measured_here, left)
        if fastest is not None:
            first, last = self._quickest_first(peers, planned, starts, left, [fastest])
            run.peer_notes.append(
                f"{fastest.backend} goes first though it is not the quickest to build: it is "
                f"expected to run fastest on a {run.device.kind}, and this machine's builds of "
                f"it say it fits ({planned[fastest.backend]:.0f} s of the {left:.0f} s left)"
            )
        if first and last:
            names = ", ".join(c.backend for c in last)
            run.peer_notes.append(
                f"{', '.join(c.backend for c in first)} first, with the {left:.0f} s left for "
                f"tuning; {names} after the passes, with what is left"
            )
        elif first:
            run.peer_notes.append(f"the peers go first, with the {left:.0f} s left for tuning")
        elif planned:  # none fits: the quickest compile says what budget would
            quickest = min(planned, key=planned.__getitem__)
            used = run.options.budget_s * (1 - FINISH_SHARE) - left
            needed = (used + planned[quickest] + self.peer_s()) / (1 - FINISH_SHARE)
            run.peer_notes.append(
                f"no peer is expected to fit: {quickest} needs about {planned[quickest]:.0f} s "
                f"and {left:.0f} s are left for tuning; a budget of about {needed:.0f} s would "
                "build and time it. The passes go first and the peers get what is left"
            )
        for note in run.peer_notes:
            say(0.05, f"peers: {note}")
        return first, last

    def _quickest_first(
        self,
        peers: list[Candidate],
        planned: dict[str, float],
        starts: dict[str, float],
        left: float,
        chosen: list[Candidate],
    ) -> tuple[list[Candidate], list[Candidate]]:
        """(first, last): `chosen`, then the quickest builds (`planned`), as long as what each
        is started with (`starts`) fits together."""
        first, last = list(chosen), []
        spent = sum(starts.get(c.backend, 0.0) + self.peer_s() for c in chosen)
        for cand in sorted(peers, key=lambda c: planned.get(c.backend, 0.0)):
            if cand in chosen:
                continue
            cost = starts.get(cand.backend, 0.0) + self.peer_s()
            if spent + cost <= left:
                first.append(cand)
                spent += cost
            else:
                last.append(cand)
        return first, last

    def _fastest_that_fits(
        self,
        last: list[Candidate],
        planned: dict[str, float],
        measured_here: set[str],
        left: float,
    ) -> Candidate | None:
        """The device's fastest peer (FASTEST_PEER), where it was left out of `first` but its
        build, measured on this machine before (`measured_here`), fits alone. Not where it is
        timed at several sizes: there its timing needs more than one check's time (recsys_dyn
        at 60 s: its package built in 37 s, then no round fitted at batch 4096, and the original
        shipped). Nor where a runtime is a peer (see FASTEST_PEER)."""
        run = self.run
        if len(run.points) > 1 or any(is_runtime(b) for b in planned):
            return None
        name = FASTEST_PEER.get(run.device.kind)
        for cand in last:
            if cand.backend != name or cand.backend not in measured_here:
                continue
            if planned[cand.backend] + self.peer_s() <= left:
                return cand
        return None

    def stand_ins(self, blind: list[Candidate], say: Progress) -> list[Candidate]:
        """When no peer is expected to fit, what is judged before the site search: the original
        with every pass in eager (no compile: one check and one timing, where those fit), then
        the quickest compiled candidate with every pass that is expected to fit. On a short
        budget the search could otherwise leave no time for either (resnet18 at 60 s beside two
        busy processes: every pass in eager, 1.2x over the original at 300 s, was skipped)."""
        eager = [c for c in blind if c.passes and c.backend == "eager"]
        first = eager[:1] if eager and self.check_s() <= self.run.remaining() else []
        if first:
            note = f"{first[0].name} needs no compile: it goes first"
            self.run.peer_notes.append(note)
            say(0.05, f"peers: {note}")
        return first + self.affordable_stand_in(blind, say, spent=self.check_s() if first else 0)

    def uncompiled_with_passes(
        self, blind: list[Candidate], first: list[Candidate], say: Progress
    ) -> list[Candidate]:
        """Every pass under each peer of `first` that needs no compile (a CUDA graph captures
        in a second or two), judged with the peers. On the H200 at 45 s the recsys example's
        plain CUDA graph went first (3.05x over eager) but the search then left one second for
        the CUDA graph with every pass, which was never timed."""
        uncompiled = {c.backend for c in first if c.backend not in backends.COMPILING}
        chosen: list[Candidate] = []
        spent = 0.0
        for cand in blind:
            if cand.passes and cand.backend in uncompiled:
                if spent + self.check_s() > self.run.remaining():
                    break
                spent += self.check_s()
                chosen.append(cand)
                note = f"{cand.name} needs no compile: it is judged with the peers"
                self.run.peer_notes.append(note)
                say(0.05, f"peers: {note}")
        return chosen

    def affordable_stand_in(
        self, blind: list[Candidate], say: Progress, spent: float = 0.0
    ) -> list[Candidate]:
        """When no peer is expected to fit: the quickest compiled candidate that is, among
        `blind` (the original with every pass, under each backend: it needs no search, and the
        passes shrink the graph, so it compiles sooner), to build first while the budget is
        whole (`spent`: what goes before it). A tie goes to a backend built in a child, which
        is stopped if it overruns."""
        run = self.run
        left = run.remaining() - spent
        priced: list[tuple[float, Candidate]] = []
        for cand in blind:
            if not cand.passes or cand.backend not in backends.PEERS:
                continue
            if cand.backend not in backends.COMPILING:
                continue
            estimate = self._planned(cand)
            if estimate + self.check_s() <= left:
                priced.append((estimate, cand))
        if not priced:
            return []
        estimate, cand = min(priced, key=lambda ec: (ec[0], ec[1].backend not in STOPPABLE))
        note = (
            f"{cand.name} ({self._nodes(cand)} nodes) is expected to fit ({estimate:.0f} s): "
            "it goes first"
        )
        run.peer_notes.append(note)
        say(0.05, f"peers: {note}")
        return [cand]

    def search_deadline(
        self, early: list[Candidate], figures: list[Figures], building_s: float = 0.0
    ) -> float:
        """When the site search stops: half of what the early candidates left, never so late
        that no candidate can be checked and timed after it, nor so late that the passes
        cannot be built under the fastest one's backend (its compile, measured just now, plus
        checking and timing it) unless that cannot fit anyway. `building_s`: what applying
        every pass took, if measured; the candidates after the search apply passes twice (the
        searched ones and every one)."""
        run = self.run
        left = max(run.remaining(), 0.0)
        faster = [
            (f.speedup or 0.0, c)
            for c, f in zip(early, figures, strict=True)
            if f.verdict == Verdict.FASTER
        ]
        best = max(faster, key=lambda sc: sc[0])[1] if faster else None
        # At least one candidate after the search is built, checked and timed (eager needs no
        # compile; `check_s` includes the least timing worth starting).
        after = 2 * building_s + self.check_s()
        reserve = max(0.5 * left, after)
        if best is not None and best.backend in backends.COMPILING:
            nodes = self._nodes(best)
            estimate = run.compile_times.estimate(run.hardware_key, best.backend, nodes) or 0.0
            needed = estimate + after + run.options.whole_model_budget_s
            if needed <= left:
                reserve = max(reserve, needed)
        return time.monotonic() + max(left - reserve, 0.0)


def _started_at(backend: str, planned_s: float, measured: bool) -> float:
    """The seconds a compile planned at `planned_s` must fit in to be started: all of them, or,
    with nothing measured here for a build in a child (stopped if it overruns), STOPPABLE_SHARE
    of its prior."""
    return planned_s if measured or backend not in STOPPABLE else STOPPABLE_SHARE * planned_s
