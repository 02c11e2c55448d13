"""Tuning a whole program: site search, backend choice, verification (outputs.py writes files).

The result is never worse than the original: every whole-model candidate (passes under eager,
the original and the passes under inductor) is timed against the untouched original, and one is
chosen only when its speedup interval clears 1 + epsilon; otherwise the original stands.
"""

from __future__ import annotations

import copy
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch.export import ExportedProgram

from tuner import backends
from tuner.across_sizes import combined_verdict, size_figures
from tuner.apply import Transformed, apply_steps
from tuner.cache import DecisionCache
from tuner.capture import Inputs, example_inputs, to_graph_module
from tuner.config import (
    Figures,
    PassStep,
    TunedConfig,
    Verification,
    apply_config,
    steps_of,
    timing_fields,
)
from tuner.device import CPU, Device
from tuner.fingerprint import graph_fingerprint
from tuner.hardware import describe, hardware_key
from tuner.measure import check_outputs, compare, fresh_inputs, require_timing, verdict
from tuner.passes import pass_names
from tuner.search import Progress, SearchSettings, SiteSearch
from tuner.shapes import spec_of
from tuner.sites import Site
from tuner.sizes import SizePoint, size_points


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
    # each dim's minimum, the example and a large value (tuner.sizes.default_sizes).
    sizes: dict[str, list[int]] | None = None

    def __post_init__(self) -> None:
        self.device = Device.parse(self.device)


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


class Tuner:
    def __init__(self, options: TuneOptions) -> None:
        self.options = options
        self.device = require_timing(Device.parse(options.device))
        if options.threads is not None:
            torch.set_num_threads(options.threads)
        self.hardware = describe(self.device)
        self.cache = DecisionCache(options.cache_path)
        self.samples: dict[str, dict[str, list[float]]] = {}
        self.timed = 0
        self.build_s: dict[str, float] = {}  # seconds the first build+check took, per backend
        self.workdir = options.workdir or Path(tempfile.mkdtemp(prefix="fxtune-"))
        self.points: list[SizePoint] = []  # the example size first, then further sizes

    def _remaining(self, started: float) -> float:
        return self.options.budget_s - (time.monotonic() - started)

    def _candidates(
        self, gm0: fx.GraphModule, inputs: Inputs, greedy: list[PassStep], every: list[str]
    ) -> list[Candidate]:
        """Whole-model candidates, most promising first, so a tight budget drops the least."""
        # Building a runner never changes its module (eager runs it, inductor exports it), so
        # one rewritten module serves every backend, as gm0 serves the baseline and "inductor".
        blind = apply_steps(copy.deepcopy(gm0), inputs, [(p, None) for p in every])
        blind_steps = _steps_from_sites(blind.applied)
        tuned = apply_steps(copy.deepcopy(gm0), inputs, steps_of(greedy)) if greedy else None
        wanted = self.options.backends or backends.available_backends(self.device)
        blind_differs = bool(blind.applied) and blind_steps != greedy
        out: list[Candidate] = []
        for b in wanted:
            if tuned is not None:
                out.append(Candidate(f"{b} + tuned passes", b, greedy, tuned))
            if b != "eager":
                out.append(Candidate(b, b, [], Transformed(gm0, inputs)))
            if blind_differs:
                out.append(Candidate(f"{b} + every pass", b, blind_steps, blind))
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
            return {"verdict": "failed to run", "reason": f"{type(exc).__name__}: {exc}"}, None
        if wrong is not None:
            return {"verdict": "wrong outputs", "reason": wrong}, None
        budget = min(self.options.whole_model_budget_s, max(self._remaining(started), 1.0))
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
        if self._remaining(started) < 1.0:
            return Figures(**fig, verdict="not measured", reason="time budget spent")
        t = cand.transformed
        try:
            built = backends.build(cand.backend, t.gm, t.inputs, self.workdir)
        except Exception as exc:
            return Figures(**fig, verdict="failed to run", reason=f"{type(exc).__name__}: {exc}")
        runner = cand.runner = built.runner
        cand.package = built.package
        per_size = []
        for i, point in enumerate(self.points or [SizePoint("example", {}, inputs)]):
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

    def tune(self, program: ExportedProgram, progress: Progress | None = None) -> TuneOutcome:
        started = time.monotonic()
        say = progress or (lambda _f, _m: None)
        say(0.0, "capturing graph")
        gm0 = to_graph_module(program).to(self.device.torch_device)
        inputs = tuple(to_device(x, self.device) for x in example_inputs(program))
        every = self.options.passes or pass_names()
        spec = spec_of(gm0)
        skipped: list[str] = []
        if spec is not None:
            say(0.02, "choosing sizes")
            points, skipped = size_points(spec, inputs, self.options.sizes, lambda a: gm0(*a))
            self.points = [
                SizePoint(p.label, p.sizes, tuple(to_device(x, self.device) for x in p.inputs))
                for p in points
            ]
        settings = SearchSettings(
            device=self.device,
            hardware_key=hardware_key(self.hardware),
            deadline=started + 0.5 * self.options.budget_s,
            site_budget_s=self.options.site_budget_s,
            epsilon=self.options.epsilon,
            passes=every,
            points=self.points if len(self.points) > 1 else [],
        )
        search = SiteSearch(settings, self.cache).run(
            copy.deepcopy(gm0), inputs, lambda f, m: say(0.05 + 0.45 * f, m)
        )
        self.samples.update(search.samples)
        self.timed += search.timed

        candidates = self._candidates(gm0, inputs, search.steps, every)
        figures: list[Figures] = []
        for i, cand in enumerate(candidates):
            say(0.5 + 0.3 * i / max(len(candidates), 1), f"timing whole model: {cand.name}")
            figures.append(self._judge(gm0, inputs, cand, started))
        winners = [
            (f, c) for f, c in zip(figures, candidates, strict=True) if f.verdict == "faster"
        ]
        if winners:
            chosen_fig, chosen = max(winners, key=lambda fc: fc[0].speedup or 0.0)
        else:
            reason = "no candidate was faster than the original beyond noise; the original stands"
            chosen_fig = Figures(
                name="original", backend="eager", passes=[], verdict="within noise", reason=reason
            )
            chosen = Candidate("original", "eager", [], Transformed(gm0, inputs), gm0)

        say(0.85, "verifying")
        fingerprint = graph_fingerprint(to_graph_module(program))
        config = TunedConfig(
            model_fingerprint=fingerprint,
            hardware=self.hardware,
            backend=chosen.backend,
            passes=chosen.passes,
            changes_inputs=bool(chosen.transformed.packers),
            sites=search.decisions,
            candidates=figures,
            whole_model=chosen_fig,
            verification=Verification(
                inputs=0, max_abs_error=None, max_rel_error=None, passed=False
            ),
            tuning={},
            shapes=spec.to_dict() if spec is not None else {},
            refusals=search.refusals,
        )
        replay = apply_config(program, config)
        replay.gm.to(self.device.torch_device)
        runner = chosen.runner if chosen.runner is not None else replay.gm
        trials = fresh_inputs(inputs, 3, seed=1234)
        for point in self.points[1:]:  # and at every further size tuned at
            trials += fresh_inputs(point.inputs, 1, seed=1234)
        # The replayed config (eager) and the chosen runner must both match the original.
        wrong = check_outputs(gm0, lambda *a: replay.gm(*replay.pack(a)), trials)
        if wrong is None:
            wrong = check_outputs(gm0, lambda *a: runner(*replay.pack(a)), trials)
        abs_err, rel_err = output_errors(gm0, lambda *a: runner(*replay.pack(a)), trials)
        config.verification = Verification(
            inputs=len(trials),
            max_abs_error=abs_err,
            max_rel_error=rel_err,
            passed=wrong is None,
            reason=wrong,
        )
        if wrong is not None:
            config.whole_model = Figures(
                name="original",
                backend="eager",
                passes=[],
                verdict="wrong outputs",
                reason=f"the tuned module failed verification ({wrong}); the original stands",
            )
            config.backend, config.passes, config.changes_inputs = "eager", [], False
            replay, runner = Transformed(gm0, inputs), gm0
        config.tuning = {
            "seconds": round(time.monotonic() - started, 2),
            "budget_s": self.options.budget_s,
            "timed_candidates": self.timed,
            "cache_hits": self.cache.hits,
            "sites_found": sum(len(s.sites) for s in search.every_site),
            "epsilon": self.options.epsilon,
            "sizes": [{"label": p.label, "sizes": p.sizes} for p in self.points],
            "sizes_skipped": skipped,
        }
        say(0.9, "tuning done")
        package = chosen.package if config.backend == "inductor" else None
        return TuneOutcome(
            config, program, replay, runner, self.samples, package, list(self.points)
        )


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


def tune_program(
    program: ExportedProgram, options: TuneOptions | None = None, progress: Progress | None = None
) -> TuneOutcome:
    return Tuner(options or TuneOptions()).tune(program, progress)
