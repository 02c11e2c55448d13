"""Whole-model candidates: a backend and pass steps applied to the original, and their steps.

Which candidates a run offers depends on what is tuned (the step kind's `candidates`,
`tuner.tuning.inference` and `tuner.tuning.train`); what a candidate is, how pass steps are read
from applied sites and from site decisions, and the per-size candidates of a dynamic program are
the same for every kind, and are here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import fx

from tuner.backends.runtimes import is_runtime
from tuner.contract.config import InductorSettings, PassStep, SiteDecision, Verdict
from tuner.deploy.replay import steps_of
from tuner.graph.capture import Inputs
from tuner.graph.copying import deep_copy
from tuner.graph.shapes import ShapeSpec
from tuner.graph.sites import Site
from tuner.graph.sizes import SizePoint
from tuner.passes.apply import Transformed, apply_steps
from tuner.search.buckets import bucket_dim

# Verdicts that mean a rewrite is wrong, whatever its speed.
WRONG = (Verdict.WRONG_OUTPUTS, Verdict.FAILED_TO_RUN)


@dataclass
class Candidate:
    name: str
    backend: str
    passes: list[PassStep]
    transformed: Transformed
    runner: Callable[..., Any] | None = None  # set once built
    package: Path | None = None  # the AOTInductor package, once built under "inductor"
    settings: InductorSettings | None = None  # inductor's, by name (`inductor_settings`)


def identity(cand: Candidate) -> tuple[str, tuple[tuple[str, tuple[str, ...]], ...]]:
    """A candidate's backend (with its inductor settings) and passes: two candidates with the
    same build the same runner."""
    backend = f"{cand.backend}@{cand.settings}" if cand.settings else cand.backend
    return backend, tuple((s.pass_name, tuple(s.sites)) for s in cand.passes)


def serves_every_size(cand: Candidate) -> bool:
    """Whether the candidate's one build serves every size (a runtime's artifact, a package
    built with inductor's settings): it is not mixed into size buckets, so slower at one size
    it cannot ship."""
    return is_runtime(cand.backend) or cand.settings is not None


def compile_key(cand: Candidate) -> str:
    """What the machine's compile times are kept under: the backend, with its settings."""
    return identity(cand)[0]


def steps_from_sites(sites: list[Site]) -> list[PassStep]:
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


def steps_from_decisions(decisions: list[SiteDecision], label: str) -> list[PassStep]:
    """The sites kept by the never-worse rule, plus those faster beyond noise at `label` and
    right (not "wrong outputs", not "failed to run") at every size; in the search's order."""
    steps: list[PassStep] = []
    for d in decisions:
        at = next((f for f in d.per_size if f.label == label), None)
        wrong = any(f.verdict in WRONG for f in d.per_size)
        if not (d.accepted or (at is not None and at.verdict == Verdict.FASTER and not wrong)):
            continue
        if steps and steps[-1].pass_name == d.pass_name:
            steps[-1].sites.append(d.site_id)
        else:
            steps.append(PassStep(pass_name=d.pass_name, sites=[d.site_id]))
    for step in steps:
        step.sites.sort()
    return steps


def size_candidates(
    gm0: fx.GraphModule,
    inputs: Inputs,
    spec: ShapeSpec | None,
    points: Sequence[SizePoint],
    decisions: list[SiteDecision],
    backends: list[str],
    have: list[Candidate],
) -> list[Candidate]:
    """Per measured size of a dynamic program: the never-worse sites plus the sites faster
    beyond noise at that size (right at every size), as whole-model candidates under each
    backend, so that a size bucket can run the pass set that won at its sizes.

    Timed last (only if the budget allows); a set the chaining cannot replay exactly
    (a later pass's site found only after an earlier rewrite that this set leaves out, or
    the reverse) is not offered, and neither is one another candidate already has.
    """
    if bucket_dim(spec, points) is None:
        return []
    seen = [c.passes for c in have]
    out: list[Candidate] = []
    for point in sorted(points, key=lambda p: tuple(p.sizes.values())):
        steps = steps_from_decisions(decisions, point.label)
        if not steps or steps in seen:
            continue
        seen.append(steps)
        built = apply_steps(deep_copy(gm0), inputs, steps_of(steps))
        if steps_from_sites(built.applied) != steps:
            continue
        out += [
            Candidate(f"{b} + passes faster at {point.label}", b, steps, built) for b in backends
        ]
    return out
