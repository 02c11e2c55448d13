"""How the dashboard writes numbers: one place, so pages and tests agree on every figure."""

from __future__ import annotations

from collections.abc import Sequence

from service.rows import TIMES
from tuner.measure.summary import format_interval

NA = "n/a"


def _three_digits(x: float) -> str:
    """Three significant figures without switching to exponents: 5.29, 68.0, 222."""
    size = abs(x)
    if size >= 100:
        return f"{x:.0f}"
    if size >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def duration_us(us: float | None) -> str:
    if us is None:
        return NA
    size = abs(us)
    if size >= 1e6:
        return f"{_three_digits(us / 1e6)} s"
    if size >= 1e3:
        return f"{_three_digits(us / 1e3)} ms"
    return f"{_three_digits(us)} µs"


def duration_s(seconds: float | None) -> str:
    return NA if seconds is None else duration_us(seconds * 1e6)


def ratio(x: float) -> str:
    """Two decimals, but a tiny ratio keeps three significant figures instead of reading 0.00."""
    return f"{x:.2f}" if abs(x) >= 0.1 else f"{x:.3g}"


def speedup(x: float | None) -> str:
    return NA if x is None else f"{ratio(x)}{TIMES}"


def interval(ci: Sequence[float | None] | None) -> str:
    """The CLI's format (`tuner.measure.summary.format_interval`): an open side prints as 'open'.

    Stored rows cannot tell "not measured" from "open on both sides", so both read n/a.
    """
    if not ci or all(b is None for b in ci):
        return NA
    return format_interval(ci, missing=NA)


def count(x: float | None) -> str:
    if x is None:
        return NA
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def size_bytes(n: float | None) -> str:
    if n is None:
        return NA
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    value, unit = float(n), 0
    while abs(value) >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    return f"{value:.0f} B" if unit == 0 else f"{value:.1f} {units[unit]}"


def error(x: float | None) -> str:
    return NA if x is None else f"{x:.2g}"


def share(x: float | None) -> str:
    return NA if x is None else f"{x:.1%}"


def filters() -> dict[str, object]:
    """The Jinja2 filters the templates use."""
    return {
        "duration_s": duration_s,
        "duration_us": duration_us,
        "speedup": speedup,
        "interval": interval,
        "count": count,
        "size_bytes": size_bytes,
        "error": error,
        "share": share,
    }
