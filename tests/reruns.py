"""Why a test that passed on its rerun failed the first time (registered by tests/conftest.py)."""

from __future__ import annotations

import pytest

RERUN_LINES = 30  # of each first failure's report, in the run's summary


class FirstFailures:
    """Keeps why a test that passed on its rerun failed the first time, and prints it at the
    end: the rerun plugin names such a test only, and a flake whose cause is not printed
    cannot be looked into. Under xdist the workers' reports reach the controller, which prints."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.outcome == "rerun" and report.longreprtext:
            tail = report.longreprtext.strip().splitlines()[-RERUN_LINES:]
            self.texts.append("\n".join([f"{report.nodeid} ({report.when}):", *tail]))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.texts:
            terminalreporter.section("why each rerun test failed the first time")
            for text in self.texts:
                terminalreporter.write_line(text)
