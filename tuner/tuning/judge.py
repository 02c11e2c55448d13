"""Judging a whole-model candidate: built, checked, then timed against the original.

At each size the run tunes at (the example's first), the candidate's runner is checked against
the original (the step kind's check; a wrong one is never timed) and then timed, interleaved with
the original's call (`tuner.measure.timing.compare`). Its verdict across sizes is the
never-worse one (`tuner.search.across_sizes`). A candidate that cannot be started within the
budget, or whose build overruns or crashes, is recorded with the reason instead. Where the choice
hinges on two candidates, each timed against the original in a comparison of its own, `runoff`
times them against each other (`tuner.tuning.choose.Contest`).

At inference each timed call takes the original's inputs and packs them where a pass repacks
them (`combine_sparse_inputs`), as `load_tuned` runs what ships: on the recommendation example
the packing is 8% of the call, and a candidate timed on inputs packed once would have been
credited with it. A training step takes them packed once (its site run's
`SiteRun.packs_per_call`): the training loop packs, and `load_tuned` refuses packed training
configs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import fx

from tuner.backends.isolation import CompileCrashed, CompileOverrun
from tuner.backends.registry import OWN_THREAD_POOL
from tuner.backends.runtime_build import NotForRuntime
from tuner.contract.config import Figures, SizeFigures, Verdict
from tuner.graph.capture import Inputs
from tuner.graph.sizes import SizePoint
from tuner.host import failures
from tuner.measure.timing import (
    POOLED,
    SINGLE,
    Blocks,
    Together,
    compare,
    compare_together,
    quick_per_call_s,
    steady_per_call_s,
)
from tuner.measure.verdicts import Comparison, timing_fields, verdict
from tuner.search.across_sizes import combined_verdict, size_figures
from tuner.search.buckets import ORIGINAL
from tuner.search.site_search import OUT_OF_BUDGET, Progress
from tuner.tuning.budget import MIN_TIMING_S, Budget
from tuner.tuning.candidates import WRONG, Candidate, serves_every_size
from tuner.tuning.choose import Runoff, contest, margin
from tuner.tuning.run import Captured, TuningRun
from tuner.tuning.step_kind import StepKind

# A candidate whose best of a few calls is this many times the original's time is recorded as
# slower without an interleaved comparison: ONNX Runtime on embedding bags ran at 0.03-0.04x
# eager, and timing it properly at three sizes took the budget the AOTInductor peer needed
# (the zoo's dynamic recommendation model at 60 s shipped 0.55x AOTInductor).
CLEARLY_SLOWER = 3.0
# A peer's best of 2 calls (`Judge.peers`) may misjudge it by this much: one glanced at over this
# many times the fastest glance is not timed. Glances against the
# comparisons that followed, on 2 cores: within 1.04-1.36x on the zoo's dynamic and CNN models,
# but AOTInductor's on the recommendation example read 2.5x its time (2.51 ms, then measured
# at 2.01x the original's 2.0 ms): its glance follows its build, as the next compile child
# starts and takes a core.
QUICK_DOUBT = 3.0
NO_ROUND = "no timed round fitted in what was left of the time budget"


def blocks_for(*candidates: Candidate) -> Blocks:
    """Blocks of calls, each after a pause, where a side runs on a thread pool of its own (a
    runtime): its threads and torch's spin on after a call and would slow the other side's
    next ones."""
    return POOLED if any(c.backend in OWN_THREAD_POOL for c in candidates) else SINGLE


@dataclass(frozen=True)
class Rounds:
    """Peers timed together with the original at the example's size (`Judge._together`):
    the original is variant 0 of `together`, `peers[k]` variant k + 1."""

    peers: list[Candidate]
    together: Together


class Judge:
    """Judges candidates for one run, adding their samples and comparisons to it."""

    def __init__(self, run: TuningRun, kind: StepKind, budget: Budget) -> None:
        self.run = run
        self.kind = kind
        self.budget = budget

    def all(
        self,
        captured: Captured,
        candidates: list[Candidate],
        say: Progress,
        span: tuple[float, float],
    ) -> list[Figures]:
        """Each candidate's figures, in order; progress moves across `span`."""
        figures: list[Figures] = []
        low, high = span
        for i, cand in enumerate(candidates):
            done = low + (high - low) * i / max(len(candidates), 1)
            say(done, f"timing whole model: {cand.name}")
            figures.append(self.one(captured, cand))
        return figures

    def peers(
        self,
        captured: Captured,
        peers: list[Candidate],
        say: Progress,
        span: tuple[float, float],
    ) -> tuple[list[Figures], Rounds | None]:
        """Each peer's figures, in order, and their rounds together. All are built, checked
        and glanced at (their best of 2 calls) first, then timed together with the original at
        the example's size, in the same rounds (`_together`): any two peers then compare as one
        head-to-head would (`settle_peers`), where each timed in a comparison of its own
        drifted apart (gpt2_2layer at 60 s: ONNX Runtime shipped at 0.93x [0.77, 0.94] of
        OpenVINO, the two 1.31x and 1.37x over the original, and no time was left to time them
        against each other). A peer glanced at over `QUICK_DOUBT` times the fastest glance is
        not timed; one the rounds gave no interval, or that did not fit them (`_joint`), is
        compared on its own. Then each at the further sizes, as `all`. Where no call time is
        known (off the CPU), in order, as `all`, with no rounds."""
        if self.run.model_time_s is None or len(peers) < 2:
            return self.all(captured, peers, say, span), None
        low, high = span
        done: dict[int, Figures] = {}
        looked: list[tuple[float, int, dict[str, Any]]] = []
        for i, cand in enumerate(peers):
            say(low + (high - low) * i / (2 * len(peers)), f"building {cand.name}")
            got = self._build(cand)
            if isinstance(got, Figures):
                done[i] = got
                continue
            looked_at = self._look(captured.gm, captured.inputs, cand, self.run.model_time_s)
            if isinstance(looked_at, dict):  # settled at the example's size
                done[i] = self._measure(captured, cand, got, looked_at)
            else:
                looked.append((looked_at, i, got))
        ranked = sorted(looked, key=lambda q: (q[0], q[1]))
        timed = [q for q in ranked if q[0] <= QUICK_DOUBT * ranked[0][0]]
        for quick_s, i, fig in ranked[len(timed) :]:
            reason = _outrun(quick_s, ranked[0][0], peers[ranked[0][1]].name)
            done[i] = Figures(**fig, verdict=Verdict.NOT_MEASURED, reason=reason)
        if ranked:
            glances = ", ".join(f"{peers[i].name} {1e3 * q:.3g} ms" for q, i, _ in ranked)
            self.run.peer_notes.append(f"best of 2 calls: {glances}")
        say(low + (high - low) * 0.5, "timing the peers together")
        example: list[dict[str, Any] | float] = [q for q, _, _ in timed]
        joint, together_s = self._joint(captured, [(peers[i], q) for q, i, _ in timed])
        rounds = None
        if joint:
            example[: len(joint)], rounds = self._together(captured, joint, together_s)
            for j, fields in enumerate(example[: len(joint)]):
                if isinstance(fields, dict) and _open(fields):
                    example[j] = timed[j][0]  # no interval from the rounds: on its own
            alone = [
                peers[i].name for j, (_, i, _) in enumerate(timed) if isinstance(example[j], float)
            ]
            with_them = f"; {', '.join(alone)} on its own after them" if alone else ""
            names = ", ".join(c.name for c in joint)
            self.run.peer_notes.append(f"timed together with the original: {names}{with_them}")
        for j, (_, i, fig) in enumerate(timed):
            say(low + (high - low) * (0.5 + j / (2 * len(timed))), f"timing {peers[i].name}")
            done[i] = self._measure(captured, peers[i], fig, example[j])
        for quick_s, i, fig in timed:
            if self._compare_again(done[i]):
                say(low + (high - low) * 0.99, f"timing {peers[i].name} again")
                done[i] = self._measure(captured, peers[i], fig, quick_s)
        return [done[i] for i in range(len(peers))], rounds

    def _joint(
        self, captured: Captured, glanced: list[tuple[Candidate, float]]
    ) -> tuple[list[Candidate], float]:
        """The peers (fastest glance first) timed together, and the time their rounds get: as
        many as fit their rounds in that time (`Budget.together_fits`), none where fewer than
        two do; the others are compared on their own after them."""
        baseline = self.kind.baseline(captured.gm)
        base_s = self.run.model_time_s or 0.0
        joint = [c for c, _ in glanced]
        while len(joint) > 1:
            calls = [base_s, *(q for _, q in glanced[: len(joint)])]
            budget_s = self.budget.together_s(baseline, len(joint))
            if self.budget.together_fits(calls, blocks_for(*joint), budget_s):
                return joint, budget_s
            joint.pop()
        return [], 0.0

    def _together(
        self, captured: Captured, cands: list[Candidate], budget_s: float
    ) -> tuple[list[dict[str, Any]], Rounds]:
        """`cands`, built and checked, timed with the original in the same rounds at the
        example's size (`compare_together`) for `budget_s`: each one's figure fields against
        the original, and the rounds."""
        baseline, inputs = self.kind.baseline(captured.gm), captured.inputs
        calls = [lambda: baseline(*inputs)]
        for cand in cands:
            runner, feed = self.kind.timed_call(cand.runner), self._feed(cand, inputs)
            calls.append(lambda runner=runner, feed=feed: runner(*feed()))
        with self.run.clocked("timing"):
            together = compare_together(
                calls,
                device=self.run.device,
                budget_s=budget_s,
                clock=self.run.clock,
                blocks=blocks_for(*cands),
            )
        self.run.timed += 1
        fields = []
        for k, cand in enumerate(cands, 1):
            c = together.comparison(0, k)
            self.run.samples[f"model:{cand.name}"] = {
                "baseline_s": c.baseline_s,
                "candidate_s": c.candidate_s,
            }
            fields.append(self._fields(cand, c))
        return fields, Rounds(cands, together)

    def settle_peers(
        self,
        captured: Captured,
        peers: list[Candidate],
        figures: list[Figures],
        rounds: Rounds | None,
    ) -> list[Runoff]:
        """The contests between peers (`contest`) that their `rounds` together settle, each
        loser out of the next, until none is left: what `choose` is given as settled."""
        if rounds is None:
            return []
        together = rounds.together
        index = {id(c): k for k, c in enumerate(rounds.peers, 1)}
        settled: list[Runoff] = []
        while True:
            found = contest(captured, peers, figures, self.run.options.epsilon, settled)
            if found is None or not found.peers:
                return settled
            challenger, holder = found.challenger[1], found.holder[1]
            if id(challenger) not in index or id(holder) not in index:
                return settled
            c = together.comparison(index[id(holder)], index[id(challenger)])
            if c.summary.low is None:  # too few rounds for an interval: not settled
                return settled
            settled.append(Runoff(found, c))

    def _compare_again(self, fig: Figures) -> bool:
        """Whether a peer whose comparison at the example's size fitted no round in a whole
        comparison's time is compared once more, after the other peers: where what is left
        still holds a whole comparison and a check. Not compared, it could not be the floor:
        shufflenet_v2 at 60 s shipped OpenVINO at 0.96x [0.89, 0.97] of ONNX Runtime, whose
        comparison (3 ms calls, 6 s) fitted none; what stalled it did not recur."""
        first = fig.per_size[0] if fig.per_size else fig
        if fig.verdict != Verdict.NOT_MEASURED or first.reason != NO_ROUND:
            return False
        needed = self.run.options.whole_model_budget_s + self.budget.check_s()
        return self.run.remaining() >= needed

    def one(self, captured: Captured, cand: Candidate) -> Figures:
        """The candidate's figures at every size, or why it was not measured."""
        got = self._build(cand)
        return got if isinstance(got, Figures) else self._measure(captured, cand, got)

    def _build(self, cand: Candidate) -> Figures | dict[str, Any]:
        """Its runner built (set on `cand`) and the figures' fields so far, or, where it was
        not started or did not build, its figures with why."""
        fig = dict(name=cand.name, backend=cand.backend, passes=cand.passes, settings=cand.settings)
        left = self.run.remaining()
        if left < 1.0:
            return Figures(**fig, verdict=Verdict.NOT_MEASURED, reason=OUT_OF_BUDGET)
        skip = self.budget.check_wont_fit(left) or self.budget.compile_wont_fit(cand, left)
        if skip is not None:
            return Figures(**fig, verdict=Verdict.NOT_MEASURED, reason=skip)
        began = time.monotonic()
        try:
            with self.run.clocked("building"):
                built = self.kind.build(cand, self.budget.build_timeout(left))
        except CompileOverrun as exc:
            failures.fallback(exc, f"building candidate {cand.name}")
            return Figures(**fig, verdict=Verdict.NOT_MEASURED, reason=str(exc))
        except CompileCrashed as exc:
            failures.fallback(exc, f"building candidate {cand.name}")
            return Figures(**fig, verdict=Verdict.CRASHED, reason=str(exc))
        except NotForRuntime as exc:  # a training step, a program that mutates its buffers
            return Figures(**fig, verdict=Verdict.NOT_MEASURED, reason=str(exc))
        except Exception as exc:
            reason = failures.fallback(exc, f"building candidate {cand.name}").reason
            return Figures(**fig, verdict=Verdict.FAILED_TO_RUN, reason=reason)
        cand.runner = built.runner
        cand.package = built.package
        fig["build_s"] = round(time.monotonic() - began, 2)
        return fig

    def _measure(
        self,
        captured: Captured,
        cand: Candidate,
        fig: dict[str, Any],
        looked: dict[str, Any] | float | None = None,
    ) -> Figures:
        """A built candidate checked and timed at every size; `looked`: what `_look` found at
        the example's size already (the fields that settled it there, or its best of 2 calls)."""
        runner = cand.runner
        points = self.run.points
        per_size = []
        baseline = self.kind.baseline(captured.gm)
        for i, point in enumerate(points or [SizePoint("example", {}, captured.inputs)]):
            unmeasured = self._unmeasured(baseline, point, per_size) if i else None
            if unmeasured is not None:
                per_size.append(size_figures(point.label, point.sizes, unmeasured))
                continue
            at = captured.inputs if i == 0 else point.inputs
            base_s = self.run.model_time_s if i == 0 else self.run.size_time_s.get(point.label)
            if i == 0 and isinstance(looked, dict):
                fields, c = looked, None
            else:
                checked = i == 0 and looked is not None
                timing_s = self.budget.timing_s(baseline, i)
                fields, c = self.at(captured.gm, at, cand, runner, timing_s, base_s, checked)
            if c is not None:
                suffix = f"@{point.label}" if i else ""
                self.run.samples[f"model:{cand.name}{suffix}"] = {
                    "baseline_s": c.baseline_s,
                    "candidate_s": c.candidate_s,
                }
            per_size.append(size_figures(point.label, point.sizes, fields))
            if fields["verdict"] in WRONG or (
                fields["verdict"] == Verdict.SLOWER and serves_every_size(cand)
            ):
                break  # it cannot ship: the other sizes are not worth their time
        head = per_size[0].model_dump(exclude={"label", "sizes"})
        if len(points) <= 1:
            return Figures(**fig, **head)
        verdict_, reason = combined_verdict(per_size)
        head.update(verdict=verdict_, reason=reason or head.get("reason"))
        return Figures(**fig, **head, per_size=per_size)

    def _unmeasured(
        self, baseline: Callable[..., Any], point: SizePoint, before: list[SizeFigures]
    ) -> dict[str, Any] | None:
        """Why a candidate is not checked and timed at a further size (None: it is). Not where
        its least check and comparison there do not fit what is left (a batch of 64 can take
        a second a call); nor, where what is left cannot give the further sizes to two
        candidates, when it was not faster at the example's size: the time is kept for one
        that was (distilbert_dyn at 60 s beside two busy processes: every pass in eager,
        within noise at batch 4, took 20 s at batch 2 and 64, and OpenVINO, 1.21x at batch 4,
        found none left there). Unmeasured, the size runs another bucket's decision or the
        original."""
        left = self.run.remaining()
        if left < MIN_TIMING_S:
            return {"verdict": Verdict.NOT_MEASURED, "reason": OUT_OF_BUDGET}
        needed = self.budget.size_least_s(baseline, point)
        if left < needed:
            reason = (
                f"checking and timing at {point.label} need about {needed:.0f} s and "
                f"{left:.0f} s of the time budget are left"
            )
            return {"verdict": Verdict.NOT_MEASURED, "reason": reason}
        example = before[0]
        if example.verdict != Verdict.FASTER and left < 2 * self.budget.further_sizes_s(baseline):
            reason = (
                f"{example.verdict} at {example.label}: the {left:.0f} s left are kept for a "
                "candidate faster there"
            )
            return {"verdict": Verdict.NOT_MEASURED, "reason": reason}
        return None

    def at(
        self,
        gm0: fx.GraphModule,
        inputs: Inputs,
        cand: Candidate,
        runner: Callable[..., Any],
        timing_s: float | None = None,
        base_s: float | None = None,
        checked: bool = False,
    ) -> tuple[dict[str, Any], Comparison | None]:
        """Check and time a built candidate at one size: (figure fields, comparison or None);
        the comparison gets `timing_s` (default: the whole-model budget). With `base_s` (the
        original's best call time there), a candidate `CLEARLY_SLOWER` is not compared.
        `checked`: checked and glanced at here already (`_look`)."""
        if not checked:
            looked = self._look(gm0, inputs, cand, base_s)
            if isinstance(looked, dict):
                return looked, None
        baseline, candidate = self.kind.baseline(gm0), self.kind.timed_call(runner)
        feed = self._feed(cand, inputs)
        with self.run.clocked("timing"):
            c = compare(
                lambda: baseline(*inputs),
                lambda: candidate(*feed()),
                device=self.run.device,
                budget_s=min(timing_s, self.run.remaining())
                if timing_s
                else self.run.timing_budget(),
                clock=self.run.clock,
                blocks=blocks_for(cand),
            )
        self.run.timed += 1
        return self._fields(cand, c), c

    def _fields(self, cand: Candidate, c: Comparison) -> dict[str, Any]:
        """A comparison against the original as figure fields, with the candidate's verdict."""
        if c.rounds == 0:
            return {"verdict": Verdict.NOT_MEASURED, "reason": NO_ROUND}
        bar = margin(cand, self.run.options.epsilon)
        return {**timing_fields(c), "verdict": verdict(c, bar)}

    def _look(
        self, gm0: fx.GraphModule, inputs: Inputs, cand: Candidate, base_s: float | None
    ) -> dict[str, Any] | float:
        """A built candidate's outputs checked at one size, then its best of 2 calls there
        (with `base_s`, the original's): the figure fields where that settles it (it failed,
        is wrong, or is `CLEARLY_SLOWER`), else those seconds (inf where not timed)."""
        try:
            with self.run.clocked("checking outputs"):
                wrong = self.kind.check(gm0, inputs, cand.runner, cand.transformed.pack)
        except Exception as exc:
            reason = failures.fallback(exc, f"checking candidate {cand.name}").reason
            return {"verdict": Verdict.FAILED_TO_RUN, "reason": reason}
        if wrong is not None:
            return {"verdict": Verdict.WRONG_OUTPUTS, "reason": wrong}
        if not base_s:
            return math.inf
        candidate, feed = self.kind.timed_call(cand.runner), self._feed(cand, inputs)
        with self.run.clocked("timing"):
            cand_s = quick_per_call_s(lambda: candidate(*feed()), repeats=2)
            if cand_s > CLEARLY_SLOWER * base_s:
                # Taken again before it settles anything: right after a build the cores can be
                # shared with a starting child (a freezing package read 19x the original's time
                # there, and faster than it in the comparison).
                cand_s = min(cand_s, steady_per_call_s(lambda: candidate(*feed())))
        if cand_s > CLEARLY_SLOWER * base_s:
            return _clearly_slower(base_s, cand_s)
        return cand_s

    def runoff(
        self,
        captured: Captured,
        candidates: list[Candidate],
        figures: list[Figures],
        say: Progress,
        settled: list[Runoff] | None = None,
    ) -> Runoff | None:
        """The two candidates the choice hinges on (`contest`, less those `settled` put out),
        timed head to head on the example's inputs, where the budget leaves room for that and
        for verifying what ships."""
        found = contest(captured, candidates, figures, self.run.options.epsilon, settled)
        budget_s = self.budget.runoff_s(self.run.remaining())
        if found is None or budget_s is None:
            return None
        (_, challenger), (_, holder) = found.challenger, found.holder
        held, challenging = self._timed(captured, holder), self._timed(captured, challenger)
        if held is None or challenging is None:
            return None
        say(0.85, f"timing {challenger.name} against {holder.name} head to head")
        inputs = captured.inputs
        theirs, ours = self._feed(holder, inputs), self._feed(challenger, inputs)
        c = compare(
            lambda: held(*theirs()),
            lambda: challenging(*ours()),
            device=self.run.device,
            budget_s=budget_s,
            clock=self.run.clock,
            blocks=blocks_for(holder, challenger),
        )
        self.run.timed += 1
        self.run.samples[f"runoff:{challenger.name} vs {holder.name}"] = {
            "baseline_s": c.baseline_s,
            "candidate_s": c.candidate_s,
        }
        return Runoff(found, c)

    def _feed(self, cand: Candidate, inputs: Inputs) -> Callable[[], Inputs]:
        """The inputs of each timed call of `cand`: the original's, packed per call where a
        pass repacks them and the step kind says so, else packed once here."""
        pack = cand.transformed.pack
        if self.kind.site_run.packs_per_call:
            return lambda: pack(inputs)
        packed = pack(inputs)
        return lambda: packed

    def _timed(self, captured: Captured, cand: Candidate) -> Callable[..., Any] | None:
        """What timing calls for `cand`: the original's baseline, or its built runner."""
        if cand.name == ORIGINAL:
            return self.kind.baseline(captured.gm)
        return None if cand.runner is None else self.kind.timed_call(cand.runner)


def _open(fields: dict[str, Any]) -> bool:
    """Whether figure fields lack an interval: no round, or too few for one."""
    ci = fields.get("ci")
    return ci is None or ci[0] is None


def _outrun(quick_s: float, fastest_s: float, fastest: str) -> str:
    """Why a peer glanced at over `QUICK_DOUBT` times the fastest glance is not timed."""
    return (
        f"not timed: its best of 2 calls took {quick_s / fastest_s:.2f}x as long as "
        f"{fastest}'s, more than the {QUICK_DOUBT:g}x a glance can misjudge"
    )


def _clearly_slower(base_s: float, cand_s: float) -> dict[str, Any]:
    return {
        "verdict": Verdict.SLOWER,
        "baseline_s": base_s,
        "candidate_s": cand_s,
        "speedup": base_s / cand_s,
        "reason": (
            f"{cand_s / base_s:.1f}x the original's time at its best of 2 calls "
            f"(more than {CLEARLY_SLOWER:g}x): not compared further"
        ),
    }
