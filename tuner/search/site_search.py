"""Per-site search: atomic rules chained greedily, every decision measured on the site itself.

For each pass in chaining order, its sites are found in the graph as the earlier accepted rewrites
left it; identical sites (same structural id) are measured once; each site is extracted as a
standalone module and its rewrite timed against the untouched copy (`tuner.measure.timing`). Only
rewrites whose speedup interval clears 1 + epsilon are applied, then the next pass looks.

A node-level profile of the graph as it stands (`tuner.profiling.node_profile`) orders each pass's
sites: those covering the most of the model's time are measured first, so a short budget is spent
where it can matter, and a site whose copies together cover less than `noise_share` of the model's
time is not timed at all (rewriting it could not move the model beyond noise); its decision says so.

What one run of a site is comes from `SearchSettings.run` (the tuning mode's step kind gives it,
`tuner.tuning.step_kind`): its forward for inference; for a training step, its forward and
backward (`tuner.training.step.site_step`), since a rewrite that speeds up the forward can slow
down the backward, and a rewrite must then keep the site's gradients as well as its outputs.
Everything else (chaining, identical sites, the cache, the never-worse verdict) is the same
search.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import fx

from tuner.contract.config import PassStep, Refusal, SiteDecision, Verdict
from tuner.contract.device import CPU, Device
from tuner.graph.capture import Inputs, refresh_meta
from tuner.graph.copying import deep_copy
from tuner.graph.sites import Site
from tuner.graph.sizes import SizePoint
from tuner.host import failures
from tuner.measure.equivalence import check_outputs
from tuner.measure.inputs import fresh_inputs
from tuner.measure.timing import Clock, compare
from tuner.measure.verdicts import verdict
from tuner.passes import get_pass, pass_names
from tuner.passes.apply import apply_steps, cleanup
from tuner.passes.base import GraphPass
from tuner.profiling.node_profile import NodeProfile, profile_nodes
from tuner.search.across_sizes import combined_verdict, size_figures
from tuner.search.decisions import DecisionCache, DecisionKey
from tuner.search.extract import external_inputs, extract_site, find_same_site, record_values
from tuner.search.site_decision import site_decision
from tuner.training.step import check_site_step, site_step, wants_grad

Progress = Callable[[float, str], None]


@dataclass
class _Pair:
    """Untouched and rewritten code for one site; `pack` turns the untouched inputs into the
    rewritten module's (the identity, except for passes that change the inputs)."""

    reference: fx.GraphModule
    candidate: fx.GraphModule
    inputs: Inputs
    pack: Callable[[Inputs], Inputs] | None = None

    def packed(self, inputs: Inputs) -> Inputs:
        return inputs if self.pack is None else self.pack(inputs)

    def timed_candidate(self, run: SiteRun) -> Callable[[], Any]:
        """The candidate's timed call: packing its inputs on every call where `run` says a
        deployment does, else on inputs packed once."""
        if run.packs_per_call and self.pack is not None:
            pack, candidate = self.pack, self.candidate
            return run.call(lambda *a: candidate(*pack(a)), self.inputs)
        return run.call(self.candidate, self.packed(self.inputs))


@dataclass(frozen=True)
class SiteRun:
    """What one run of a site is: how a rewrite is checked against the untouched site (on
    several input sets, before any timing) and the call that is timed for a module on inputs.

    `grad` records the site's inputs with autograd on, so that they say which of them carry a
    gradient in the step. `cache_tag` keeps its decisions apart from other runs' in the cache.
    `packs_per_call`: a site that repacks the model's inputs is timed packing them on every
    call, as `load_tuned` runs a forward; a training loop packs once, outside the step.
    """

    name: str
    check: Callable[[_Pair, list[Inputs]], str | None]
    call: Callable[[Callable[..., Any], Inputs], Callable[[], Any]]
    grad: bool = False
    cache_tag: str = ""
    packs_per_call: bool = False


def _forward_check(pair: _Pair, trials: list[Inputs]) -> str | None:
    return check_outputs(pair.reference, lambda *a: pair.candidate(*pair.packed(a)), trials)


def _training_check(pair: _Pair, trials: list[Inputs]) -> str | None:
    return check_site_step(
        pair.reference, pair.candidate, trials, wants_grad(pair.inputs), pair.packed
    )


FORWARD = SiteRun("forward", _forward_check, lambda m, a: lambda: m(*a), packs_per_call=True)
FORWARD_BACKWARD = SiteRun(
    "forward+backward", _training_check, site_step, grad=True, cache_tag="+backward"
)


@dataclass
class SearchSettings:
    device: Device = CPU
    hardware_key: str = ""
    backend: str = "eager"
    deadline: float = float("inf")  # time.monotonic() after which nothing new is measured
    site_budget_s: float = 2.0
    epsilon: float = 0.02
    passes: list[str] | None = None
    # Further sizes of a dynamic program to measure each site at (the example's comes first).
    points: list[SizePoint] = field(default_factory=list)
    # Seconds per call of the whole model (example size): no site inside it can take longer.
    model_time_s: float | None = None
    run: SiteRun = FORWARD
    # A site whose copies together cover less than this share of the model's time (by the
    # node profile) is not timed; None times every site.
    noise_share: float | None = None
    clock: Clock = "wall"  # what CPU timings measure (`tuner.measure.timing.Clock`)


# A site's baseline (times its identical copies) may exceed the model's own time by this much
# before it counts as contradicting it: the two are timed apart, under different loads.
CONSISTENCY_SLACK = 1.5


@dataclass
class SearchResult:
    gm: fx.GraphModule
    inputs: Inputs
    steps: list[PassStep] = field(default_factory=list)
    every_site: list[PassStep] = field(default_factory=list)
    decisions: list[SiteDecision] = field(default_factory=list)
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    timed: int = 0
    refusals: list[Refusal] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """How the distinct sites were decided, for the report: timed here, taken from the
        decision cache, below the noise share, left for lack of budget; and the identical
        copies that shared a decision instead of being measured again."""
        out = {"distinct": len(self.decisions), "timed": 0, "from_cache": 0}
        out |= {"below_noise": 0, "out_of_budget": 0, "identical_copies": 0}
        for d in self.decisions:
            out["identical_copies"] += d.count - 1
            if d.cached:
                out["from_cache"] += 1
            elif d.share is not None and d.reason and d.reason.startswith(BELOW_NOISE):
                out["below_noise"] += 1
            elif d.reason == OUT_OF_BUDGET:
                out["out_of_budget"] += 1
            elif d.rounds:
                out["timed"] += 1
        return out


BELOW_NOISE = "below noise"
OUT_OF_BUDGET = "time budget spent"


def _decision(site: Site, count: int, v: Verdict, **kw: Any) -> SiteDecision:
    return site_decision(site.pass_name, site.id, site.summary, v, count=count, **kw)


class SiteSearch:
    def __init__(self, settings: SearchSettings, cache: DecisionCache) -> None:
        self.settings = settings
        self.cache = cache

    def _judge(
        self, site: Site, count: int, pair: _Pair, result: SearchResult, label: str = ""
    ) -> SiteDecision:
        """The check first (a wrong rewrite is never timed), then interleaved timing."""
        run = self.settings.run
        trials = [pair.inputs, *fresh_inputs(pair.inputs, 2)]
        wrong = run.check(pair, trials)
        if wrong is not None:
            return _decision(site, count, Verdict.WRONG_OUTPUTS, reason=wrong)
        c = compare(
            run.call(pair.reference, pair.inputs),
            pair.timed_candidate(run),
            device=self.settings.device,
            budget_s=self.settings.site_budget_s,
            clock=self.settings.clock,
        )
        result.timed += 1
        result.samples[f"{site.pass_name}:{site.id}" + (f"@{label}" if label else "")] = {
            "baseline_s": c.baseline_s,
            "candidate_s": c.candidate_s,
        }
        return _decision(site, count, verdict(c, self.settings.epsilon), comparison=c)

    def _site_pair(
        self, gm: fx.GraphModule, graph_pass: GraphPass, site: Site, values: dict[str, Any]
    ) -> _Pair | None:
        """The site extracted with the real values flowing into it, and its rewritten copy."""
        piece = extract_site(gm, site.nodes, values)
        cand = deep_copy(piece.gm)
        same = find_same_site(graph_pass, cand, site)
        if same is None:
            return None
        graph_pass.rewrite(cand, same)
        cleanup(cand)
        refresh_meta(cand, piece.inputs)
        return _Pair(piece.gm, cand, piece.inputs)

    @staticmethod
    def _whole_pair(gm: fx.GraphModule, inputs: Inputs, site: Site) -> _Pair:
        """For passes that change the inputs: the site is the model's signature.

        At inference the packing is timed with the candidate, as `load_tuned` runs it.
        """
        cand = apply_steps(deep_copy(gm), inputs, [(site.pass_name, {site.id})])
        return _Pair(gm, cand.gm, inputs, cand.pack if cand.packers else None)

    def _decide(
        self,
        gm: fx.GraphModule,
        inputs: Inputs,
        graph_pass: GraphPass,
        site: Site,
        values: dict[str, Any],
        result: SearchResult,
        count: int,
        extra: list[tuple[SizePoint, Inputs, dict[str, Any]]] | None = None,
        share: float | None = None,
    ) -> SiteDecision:
        s = self.settings
        # Decisions across several sizes are cached under those sizes too.
        at = "@" + ";".join(p.label for p in s.points) if s.points else ""
        backend = s.backend + s.run.cache_tag
        key = DecisionKey(s.hardware_key, backend, graph_pass.version(), site.id + at)
        cached = self.cache.get(key)
        if cached is not None:
            here = {"count": count, "summary": site.summary, "cached": True}
            return cached.model_copy(update=here)
        if share is not None and s.noise_share is not None and share < s.noise_share:
            reason = (
                f"{BELOW_NOISE}: its {count} cop{'y' if count == 1 else 'ies'} cover "
                f"{share:.2%} of the model's time (node profile), under the "
                f"{s.noise_share:.1%} a whole-model comparison resolves; not timed"
            )
            return _decision(site, count, Verdict.NOT_MEASURED, reason=reason, share=share)
        if time.monotonic() > s.deadline:
            return _decision(site, count, Verdict.NOT_MEASURED, reason=OUT_OF_BUDGET, share=share)
        decision = self._measure(gm, inputs, graph_pass, site, values, result, count, "")
        # A pass that changes the inputs is timed on the whole program: no part to contradict it.
        if not graph_pass.changes_inputs and self._contradicts_model(decision):
            # Thread stalls during small kernels can inflate one measurement: measure again.
            decision = self._measure(gm, inputs, graph_pass, site, values, result, count, "")
            if self._contradicts_model(decision):
                return self._inconsistent(decision)
        if extra:
            decision = self._across_sizes(decision, gm, graph_pass, site, extra, result, count)
        if decision.verdict != Verdict.FAILED_TO_RUN:
            self.cache.put(key, decision)
        return decision.model_copy(update={"share": share})

    def _contradicts_model(self, decision: SiteDecision) -> bool:
        model = self.settings.model_time_s
        base = decision.baseline_s
        if model is None or base is None:
            return False
        return base * decision.count > model * CONSISTENCY_SLACK

    def _inconsistent(self, decision: SiteDecision) -> SiteDecision:
        """A site timed slower than the whole model twice: its timing is wrong, not the model.

        Its verdict is not trusted: the site is left unrewritten ("not measured", not cached),
        and the report says why.
        """
        base, model = decision.baseline_s or 0.0, self.settings.model_time_s or 0.0
        note = (
            f"inconsistent: site baseline {base * 1e3:.3g} ms"
            + (f" x {decision.count} copies" if decision.count > 1 else "")
            + f" > model {model * 1e3:.3g} ms, measured twice"
        )
        reason = f"{note}; its verdict ({decision.verdict}) is not trusted and the site "
        reason += "is left as it was"
        untrusted = decision.model_copy(
            update={
                "verdict": Verdict.NOT_MEASURED,
                "accepted": False,
                "reason": reason,
                "inconsistent": note,
            }
        )
        if not self.settings.points:
            return untrusted
        # Timed, so its figures at the example size are reported like every timed site's.
        example = self.settings.points[0]
        figures = size_figures(example.label, example.sizes, untrusted.model_dump())
        return untrusted.model_copy(update={"per_size": [figures]})

    def _measure(
        self,
        gm: fx.GraphModule,
        inputs: Inputs,
        graph_pass: GraphPass,
        site: Site,
        values: dict[str, Any],
        result: SearchResult,
        count: int,
        label: str,
    ) -> SiteDecision:
        """The site's decision at one size (`label` is "" for the example size)."""
        try:
            if graph_pass.changes_inputs:
                pair: _Pair | None = self._whole_pair(gm, inputs, site)
            else:
                pair = self._site_pair(gm, graph_pass, site, values)
            if pair is None:
                reason = "site not found once extracted"
                return _decision(site, count, Verdict.FAILED_TO_RUN, reason=reason)
            return self._judge(site, count, pair, result, label)
        except Exception as exc:
            where = f"measuring site {site.pass_name}:{site.id}" + (f" at {label}" if label else "")
            reason = failures.fallback(exc, where).reason
            return _decision(site, count, Verdict.FAILED_TO_RUN, reason=reason)

    def _across_sizes(
        self,
        first: SiteDecision,
        gm: fx.GraphModule,
        graph_pass: GraphPass,
        site: Site,
        extra: list[tuple[SizePoint, Inputs, dict[str, Any]]],
        result: SearchResult,
        count: int,
    ) -> SiteDecision:
        """Measure at each further size; accepted only if never worse at any of them."""
        points = self.settings.points
        per_size = [size_figures(points[0].label, points[0].sizes, first.model_dump())]
        if first.verdict not in (Verdict.WRONG_OUTPUTS, Verdict.FAILED_TO_RUN):
            for point, inputs, values in extra:
                d = self._measure(gm, inputs, graph_pass, site, values, result, count, point.label)
                per_size.append(size_figures(point.label, point.sizes, d.model_dump()))
        verdict_, reason = combined_verdict(per_size)
        return first.model_copy(
            update={
                "verdict": verdict_,
                "accepted": verdict_ == Verdict.FASTER,
                "reason": reason or first.reason,
                "per_size": per_size,
            }
        )

    def run(
        self, gm: fx.GraphModule, inputs: Inputs, progress: Progress | None = None
    ) -> SearchResult:
        """Search in place on `gm` (pass a copy to keep the original)."""
        result = SearchResult(gm, tuple(inputs))
        names = self.settings.passes or pass_names()
        # Inputs of each further size, in the current module's signature.
        point_inputs = [p.inputs for p in self.settings.points[1:]]
        profile: NodeProfile | None = None  # of `gm` as it stands; None after a rewrite
        for i, name in enumerate(names):
            if progress:
                progress(i / len(names), f"searching {name}")
            graph_pass = get_pass(name)
            sites = graph_pass.find_sites(gm)
            for reason in graph_pass.refusals:
                refusal = Refusal(pass_name=name, reason=reason)
                if refusal not in result.refusals:
                    result.refusals.append(refusal)
            if not sites:
                continue
            result.every_site.append(PassStep(pass_name=name, sites=sorted({s.id for s in sites})))
            by_id: dict[str, list[Site]] = {}
            for site in sites:
                by_id.setdefault(site.id, []).append(site)
            if profile is None and self.settings.noise_share is not None:
                profile = profile_nodes(gm, result.inputs, self.settings.device)
            shares = {sid: _share(profile, group) for sid, group in by_id.items()}
            # The most time first; a share the profile cannot tell (None) is measured early.
            order = sorted(by_id, key=lambda sid: -2.0 if shares[sid] is None else -shares[sid])
            # Past the deadline only cached decisions apply, and they need no recorded values
            # (recording runs the whole model, once per size).
            late = time.monotonic() > self.settings.deadline
            needs_values = not graph_pass.changes_inputs and not late
            wanted = {name for s in sites for name in external_inputs(gm, s.nodes)}
            grad = self.settings.run.grad
            values = record_values(gm, result.inputs, wanted, grad=grad) if needs_values else {}
            extra = [
                (point, at, record_values(gm, at, wanted, grad=grad) if needs_values else {})
                for point, at in zip(self.settings.points[1:], point_inputs, strict=True)
            ]
            accepted: set[str] = set()
            for site_id in order:
                group = by_id[site_id]
                d = self._decide(
                    gm,
                    result.inputs,
                    graph_pass,
                    group[0],
                    values,
                    result,
                    len(group),
                    extra,
                    shares[site_id],
                )
                result.decisions.append(d)
                if d.accepted:
                    accepted.add(site_id)
            if accepted:
                applied = apply_steps(gm, result.inputs, [(name, accepted)])
                result.inputs = applied.inputs
                point_inputs = [applied.pack(at) for at in point_inputs]
                result.steps.append(PassStep(pass_name=name, sites=sorted(accepted)))
                profile = None
        if progress:
            progress(1.0, "site search done")
        return result


def _share(profile: NodeProfile | None, group: list[Site]) -> float | None:
    """The share of the model's time that a site's identical copies cover together."""
    if profile is None:
        return None
    shares = [profile.share(site.nodes) for site in group]
    if any(x is None for x in shares):
        return None
    return sum(x for x in shares if x is not None)
