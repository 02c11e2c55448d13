"""`fxtune tune --world-size N`: the distributed job, printed as a table (kept out of cli.py)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from tuner.contract.errors import FxtuneError
from tuner.contract.exit_codes import ExitCode, exit_code_for


def tune_distributed_cmd(
    model: Path,
    out: Path,
    report: Path,
    world_size: int,
    budget_s: float,
    threads: int | None,
    console: Console,
) -> None:
    """Spawn the ranks, tune in lockstep, print the decision and figure 5 per rank."""
    from tuner.distributed.tune import DistributedTuneOptions, rank_path, tune_distributed

    missing = [str(p) for r in range(world_size) if not (p := rank_path(model, r)).is_file()]
    if missing:
        Console(stderr=True).print(f"[red]error:[/red] no program for rank(s): {missing}")
        raise typer.Exit(code=ExitCode.USER_INPUT)
    # Timing budget per comparison: a quarter of the total (the rest: spawn, checks, profile).
    # The whole job may take its budget twice over (spawn, checks, profile) before it is killed.
    options = DistributedTuneOptions(
        world_size=world_size,
        budget_s=max(2.0, budget_s / 4),
        threads=threads or 1,
        job_timeout_s=max(DistributedTuneOptions.job_timeout_s, 2 * budget_s),
    )
    # A rank that raised, died or overran (`RankFailedError`) exits 1 (tuner.contract.exit_codes),
    # so a worker retries: a lost rank cannot be told from outside from a bad program, and the
    # service checked every rank's upload with the safe loader already.
    try:
        result = tune_distributed(model, options, out=out, report=report)
    except FxtuneError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}")
        raise typer.Exit(code=exit_code_for(exc)) from None
    for site in result["sites"]:
        c = site.get("comparison") or {}
        ci = f"{c['ci_low']:.3f}-{c['ci_high']:.3f}" if c else "-"
        speed = f"{c['speedup']:.3f}x" if c else "-"
        console.print(f"{site['summary']}: {speed} ({ci}) {site['verdict']}")
    profile = result["overlap_profile"]
    if "per_rank" in profile:
        table = Table("rank", "sequential us", "overlapped us", "comm alone us", "compute us",
                      "hidden us (step)", "hidden share", "hidden us (blocked)")  # fmt: skip
        rows = [("slowest", profile["slowest_rank"]), *enumerate(profile["per_rank"])]
        for rank, f in rows:
            share = f["hidden_by_step_time_share"]
            table.add_row(
                str(rank), str(f["sequential_step_us"]), str(f["overlapped_step_us"]),
                str(f["comm_alone_us"]), str(f["compute_us"]), str(f["hidden_by_step_time_us"]),
                "-" if share is None else f"{share:.1%}", str(f["hidden_by_blocked_time_us"]),
            )  # fmt: skip
        console.print(table)
    console.print(f"accepted: {result['accepted']}; wrote {result['tuned_programs']} and {report}")
