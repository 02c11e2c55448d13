"""Tuning a sharded program across ranks: one candidate at a time, in lockstep, one decision.

Each rank holds its own program (its own embedding tables; `model_rank{rank}.pt2`), all with the
same structure. Every rank finds the same `overlap_comm_compute` sites (checked: the structural
ids must agree on all ranks, else the job stops), and for each site, in order:

1. every rank rewrites a copy of its current graph and checks the candidate's outputs against
   the current graph's on fresh inputs (`tuner.measure.equivalence`, the tuner's one rule); the
   verdict is all-reduced (MIN), so one rank's mismatch rejects the site everywhere;
2. the two run in lockstep (`tuner.distributed.lockstep`): the tuner's round loop, with a
   barrier before each sample and the slowest rank's time per round counting;
3. rank 0 decides from those times (the speedup's interval must clear 1 + epsilon, as for every
   other pass) and broadcasts the decision; every rank applies the same decision. The decision
   is the per-site search's record (`tuner.search.site_decision`), so the report's sites carry
   the config's site fields, beside the fields report_version 1 readers look for (`site`,
   `comparison`, `per_rank`, `max_abs_diff_this_rank`).

Then the comm / compute / hidden breakdown (`tuner.distributed.overlap_profile`) is measured for the
original and the tuned program, every rank writes its tuned program, and rank 0's report
carries every rank's figures.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import fx

from tuner.contract.config import SiteDecision, Verdict
from tuner.contract.device import Device
from tuner.contract.errors import FxtuneError
from tuner.distributed.lockstep import LockstepTiming, lockstep_timing
from tuner.distributed.overlap_profile import (
    blocked_per_step,
    breakdown,
    comm_alone,
    instrumented,
    median,
)
from tuner.distributed.ranks import default_backend, run_ranks
from tuner.graph.capture import Inputs, example_inputs, save_program, to_graph_module, to_program
from tuner.graph.copying import deep_copy
from tuner.graph.fingerprint import model_fingerprint
from tuner.graph.sites import Site
from tuner.host.hardware import describe
from tuner.host.torch_compat import pytree
from tuner.loading.load import load_program
from tuner.measure.equivalence import ErrorFigures, error_figures, outputs_mismatch
from tuner.measure.inputs import cloned, fresh_inputs
from tuner.measure.summary import summarize
from tuner.measure.timing import RoundRules
from tuner.measure.verdicts import Comparison, verdict
from tuner.passes import get_pass
from tuner.passes.apply import apply_steps
from tuner.search.site_decision import site_decision

PASS = "overlap_comm_compute"
REPORT_VERSION = 1


@dataclass(frozen=True)
class DistributedTuneOptions:
    """Knobs of a distributed tuning job; `budget_s` is per timed comparison."""

    world_size: int
    backend: str | None = None
    budget_s: float = 10.0
    min_rounds: int = RoundRules.min_rounds
    max_rounds: int = RoundRules.max_rounds
    epsilon: float = 0.02
    confidence: float = RoundRules.confidence
    check_inputs: int = 3
    profile_steps: int = 30
    threads: int | None = 1
    collective_timeout_s: float = 60.0
    job_timeout_s: float = 900.0
    seed: int = 0


def rank_path(pattern: str | Path, rank: int) -> Path:
    """`x_rank{rank}.pt2` patterns are filled in; a plain path gets `.rank{r}` appended."""
    text = str(pattern)
    return Path(text.format(rank=rank) if "{rank}" in text else f"{text}.rank{rank}")


def _agree(value: Any, what: str) -> None:
    """Stop the job (on every rank) unless every rank holds the same `value`."""
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    if any(v != values[0] for v in values):
        raise FxtuneError(f"ranks disagree on {what}: {values}")


def _outputs_match(
    current: fx.GraphModule, candidate: fx.GraphModule, inputs: Inputs, n: int
) -> tuple[bool, float]:
    """Equal outputs on `n` fresh input sets on this rank by the tuner's rule (the current
    graph run twice for its spread, no float64 twin: see `tuner.measure.equivalence`), then
    agreed by all ranks (MIN). Every input set runs on every rank whatever it finds, so the
    ranks' collectives stay in step."""
    figures = ErrorFigures()
    ok = True
    with torch.inference_mode():
        for args in fresh_inputs(inputs, n, seed=7):
            want = pytree.tree_leaves(current(*cloned(args)))
            again = pytree.tree_leaves(current(*cloned(args)))
            got = pytree.tree_leaves(candidate(*cloned(args)))
            ok = ok and outputs_mismatch(want, again, None, got) is None
            figures = figures.worst(error_figures(want, got))
    flag = torch.tensor([1 if ok else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item()), figures.max_abs


def _rules(o: DistributedTuneOptions, **overrides: Any) -> RoundRules:
    base = RoundRules(
        budget_s=o.budget_s,
        min_rounds=o.min_rounds,
        max_rounds=o.max_rounds,
        confidence=o.confidence,
        seed=o.seed,
    )
    return dataclasses.replace(base, **overrides)


# Why a site that was not timed was rejected: its check failed on one rank or more.
OUTPUTS_DIFFER = "outputs differ from the current program's on some rank"


def _decide(site: Site, c: Comparison | None, epsilon: float) -> SiteDecision:
    """Rank 0's decision (no comparison: the outputs differed), broadcast so that every rank
    applies exactly this one."""
    decision: list[SiteDecision | None] = [None]
    if dist.get_rank() == 0:
        if c is None:
            decision[0] = site_decision(
                PASS, site.id, site.summary, Verdict.WRONG_OUTPUTS, reason=OUTPUTS_DIFFER
            )
        else:
            decision[0] = site_decision(PASS, site.id, site.summary, verdict(c, epsilon), c)
    dist.broadcast_object_list(decision, src=0)
    assert decision[0] is not None  # rank 0 always decides
    return decision[0]


def _medians(own: list[list[float]]) -> tuple[float, float]:
    """Baseline and candidate medians of one rank's A/B rounds (`summarize`: one rule)."""
    s = summarize(own[0], own[1])
    nan = float("nan")
    return (
        nan if s.baseline_s is None else s.baseline_s,
        nan if s.candidate_s is None else s.candidate_s,
    )


def _report_site(
    decision: SiteDecision, worst: float, c: Comparison | None, timing: LockstepTiming | None
) -> dict[str, Any]:
    """A site as the report carries it: the decision's fields, and the report_version 1 ones."""
    entry = decision.model_dump(mode="json", by_alias=True)
    entry |= {"site": decision.site_id, "max_abs_diff_this_rank": worst}
    if c is not None and timing is not None:
        entry |= {"comparison": c.to_dict(), "per_rank": _per_rank(timing)}
    return entry


def _per_rank(timing: LockstepTiming) -> list[dict[str, float]]:
    return [
        {"baseline_median_us": round(b * 1e6, 1), "candidate_median_us": round(c * 1e6, 1)}
        for b, c in map(_medians, timing.per_rank)
    ]


def _profile(
    original: fx.GraphModule,
    tuned: fx.GraphModule,
    inputs: Inputs,
    o: DistributedTuneOptions,
    ab: LockstepTiming | None,
    device: str,
) -> dict[str, Any]:
    """Figure 5: comm alone, blocked time in each program, step times (slowest and per rank)."""
    comm = comm_alone(original, device)
    if comm is None:
        return {"note": "no all-to-all in the program"}
    comm_t = lockstep_timing(
        [comm], _rules(o, budget_s=o.budget_s / 4, max_rounds=50, seed=o.seed + 1)
    )
    seq_i, ovl_i = instrumented(original), instrumented(tuned)
    req_seq, wait_seq = blocked_per_step(lambda: seq_i(*inputs), o.profile_steps)
    req_ovl, wait_ovl = blocked_per_step(lambda: ovl_i(*inputs), o.profile_steps)
    blocked_seq = [r + w for r, w in zip(req_seq, wait_seq, strict=True)]
    blocked_ovl = [r + w for r, w in zip(req_ovl, wait_ovl, strict=True)]
    if ab is None:  # several sites: time the original against the fully rewritten program
        variants = [lambda: original(*inputs), lambda: tuned(*inputs)]
        ab = lockstep_timing(
            variants, _rules(o, budget_s=o.budget_s / 2, max_rounds=200, seed=o.seed + 2)
        )
    mine = breakdown(
        *_medians(ab.rounds.own),
        median(comm_t.rounds.own[0]),
        median(blocked_seq),
        median(blocked_ovl),
        median(req_seq),
    )
    blocked = torch.tensor(
        [median(blocked_seq), median(blocked_ovl), median(req_seq)], dtype=torch.float64
    )
    dist.all_reduce(blocked, op=dist.ReduceOp.MAX)
    slowest = breakdown(
        *_medians(ab.rounds.samples), median(comm_t.rounds.samples[0]), *blocked.tolist()
    )
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return {
        "method": (
            "lockstep medians (barrier before each sample; slowest rank per round): collectives "
            "alone; step times of the sequential and overlapped programs (the A/B); time inside "
            "the request and wait calls, measured by clock wrappers in copies of both programs"
        ),
        "slowest_rank": slowest,
        "per_rank": everyone,
    }


def _device() -> str:
    """NCCL ranks work on their own GPU (set by the launcher), gloo ranks on the CPU."""
    return f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"


def tune_rank(
    rank: int, world_size: int, model: str, out: str | None, o: DistributedTuneOptions
) -> dict[str, Any]:
    """One rank's share of the job (collective: every rank runs this in lockstep)."""
    started = time.perf_counter()
    program = load_program(rank_path(model, rank))
    fingerprint = model_fingerprint(program)
    _agree(fingerprint, "the model fingerprint (every rank's program must share one structure)")
    device = _device()
    inputs = tuple(
        x.to(device) if isinstance(x, torch.Tensor) else x for x in example_inputs(program)
    )
    original = to_graph_module(program).to(device)
    current = deep_copy(original)
    graph_pass = get_pass(PASS)
    sites = graph_pass.find_sites(current)
    _agree([s.id for s in sites], "the sites of overlap_comm_compute")
    decisions: list[SiteDecision] = []
    entries: list[dict[str, Any]] = []
    timed: list[str] = []  # the sites that passed the check and were timed
    only_timing: LockstepTiming | None = None
    for site in sites:
        candidate = apply_steps(deep_copy(current), inputs, [(PASS, [site.id])]).gm
        ok, worst = _outputs_match(current, candidate, inputs, o.check_inputs)
        c = None
        timing = None
        if ok:
            timing = lockstep_timing(
                [lambda a=current: a(*inputs), lambda b=candidate: b(*inputs)], _rules(o)
            )
            r = timing.rounds
            base, cand = r.samples
            c = Comparison.from_samples(
                base, cand, r.stopped, inner=r.inner, confidence=o.confidence, device=device
            )
        decision = _decide(site, c, o.epsilon)
        if c is not None and timing is not None:
            timed.append(site.id)
            only_timing = timing if len(sites) == 1 else None
        if decision.accepted:
            current = candidate
        decisions.append(decision)
        entries.append(_report_site(decision, worst, c, timing))
    rewritten = deep_copy(original)
    if timed:
        rewritten = apply_steps(rewritten, inputs, [(PASS, timed)]).gm
    overlap = _profile(original, rewritten, inputs, o, only_timing, device)
    written = None
    if out is not None:
        cpu_inputs = tuple(x.cpu() if isinstance(x, torch.Tensor) else x for x in inputs)
        program_out = to_program(current.cpu(), cpu_inputs)  # saved as it came: on the CPU
        written = str(save_program(program_out, rank_path(out, rank)))
    files: list[Any] = [None] * world_size
    dist.all_gather_object(files, written)
    return {
        "report_version": REPORT_VERSION,
        "pass": PASS,
        "world_size": world_size,
        "model_fingerprint": fingerprint,
        "hardware": describe(Device.parse(device)) | {"world_size": world_size},
        "backend": dist.get_backend(),
        "threads_per_rank": torch.get_num_threads(),
        "sites": entries,
        "accepted": [d.site_id for d in decisions if d.accepted],
        "overlap_profile": overlap,
        "tuned_programs": files,
        "seconds": round(time.perf_counter() - started, 2),
    }


def tune_distributed(
    model: str | Path,
    options: DistributedTuneOptions,
    out: str | Path | None = None,
    report: str | Path | None = None,
) -> dict[str, Any]:
    """Spawn `options.world_size` ranks, tune in lockstep, return (and write) rank 0's report."""
    backend = options.backend or default_backend()
    results = run_ranks(
        tune_rank, options.world_size, str(model), None if out is None else str(out), options,
        backend=backend, collective_timeout_s=options.collective_timeout_s,
        job_timeout_s=options.job_timeout_s, threads=options.threads,
    )  # fmt: skip
    result = results[0]
    result["options"] = asdict(options) | {"backend": backend}
    if any(r["accepted"] != result["accepted"] for r in results):
        raise FxtuneError("ranks applied different decisions")  # cannot happen: broadcast
    if report is not None:
        Path(report).parent.mkdir(parents=True, exist_ok=True)
        Path(report).write_text(json.dumps(result, indent=2, default=str))
    return result
