"""A profile summary as rich tables, for the `fxtune profile` command."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.table import Table

if TYPE_CHECKING:
    from tuner.profiling.profile import ProfileSummary

LABEL = "profile"


def _us(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:,.1f}"


def breakdown_table(summary: ProfileSummary) -> Table:
    from tuner.profiling.profile import breakdown_frame

    frame = breakdown_frame({LABEL: summary})
    table = Table("category", "us/iter", "share", title=f"time by category ({summary.device})")
    for row in frame.itertuples(index=False):
        us, share = getattr(row, f"{LABEL}_us"), getattr(row, f"{LABEL}_share")
        table.add_row(str(row.category), _us(us), "n/a" if math.isnan(share) else f"{share:.1%}")
    return table


def top_ops_table(summary: ProfileSummary, limit: int = 10) -> Table:
    table = Table("op", "category", "calls/iter", "us/iter", title="top ops")
    for op in summary.top_ops[:limit]:
        table.add_row(
            op["name"], op["category"], f"{op['calls_per_iter']:g}", _us(op["us_per_iter"])
        )
    return table


def _figure(summary: ProfileSummary, name: str, value: float | int | None, unit: str) -> str:
    if value is None:
        return f"n/a ({summary.reason(name) or 'not measured'})"
    if unit == "bytes":
        return f"{value:,} bytes"
    return f"{value:,.1f}{unit}"


def figure_lines(summary: ProfileSummary) -> list[str]:
    """The scalar figures, with the reason in place of each missing one."""
    rows = [
        ("wall", "wall_us_per_iter", " us/iter"),
        ("ops/iter", "ops_per_iter", ""),
        ("kernels/iter", "kernels_per_iter", ""),
        ("dispatch overhead", "cpu_dispatch_overhead_us", " us/iter"),
        ("device idle", "device_idle_us", " us/iter"),
        ("peak memory", "peak_memory_bytes", "bytes"),
    ]
    lines = [
        f"{label}: {_figure(summary, name, getattr(summary, name), unit)}"
        for label, name, unit in rows
    ]
    for phase, figures in summary.phases.items():
        lines.append(
            f"{phase}: {figures['wall_us_per_iter']:,.1f} us/iter, "
            f"{figures['op_calls_per_iter']:,.0f} op events/iter"
        )
    if summary.trace_path is not None:
        lines.append(f"trace: {summary.trace_path}")
    return lines
