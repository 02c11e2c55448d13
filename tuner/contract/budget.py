"""How long a tuning run may take: its budget, and the margin after which it is stopped.

The tuner plans within the budget and ends within `budget_s + 15 s` (tests/tuner/tuning/
test_budget.py); whatever runs it (a worker's job, `fxtune tune` in its sandbox) kills it at
`budget_s + KILL_MARGIN_S`, so a program that keeps a run going (a loop the tuner cannot stop, a
compile that hangs) costs at most that. The margin also covers starting the run (Python and
torch's import) on a loaded machine.
"""

from __future__ import annotations

DEFAULT_BUDGET_S = 120.0
KILL_MARGIN_S = 60.0
# A run still going this long after its budget dumps its threads' stacks (`tuner.cli`), before
# the kill, so that the error says where it was.
STACKS_AFTER_S = 45.0


def kill_after_s(budget_s: float | None) -> float:
    """Seconds after which a run with `budget_s` (None: the default) is stopped."""
    return (DEFAULT_BUDGET_S if budget_s is None else budget_s) + KILL_MARGIN_S


def overran(budget_s: float | None) -> str:
    """The error of a run stopped at its limit."""
    budget = DEFAULT_BUDGET_S if budget_s is None else budget_s
    return (
        f"tuning ran past its budget of {budget:g} s by more than the {KILL_MARGIN_S:g} s margin "
        "and was stopped: the program takes longer to tune than its budget allows (give a larger "
        "budget_s, or a smaller program)"
    )
