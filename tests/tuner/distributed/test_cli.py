"""`fxtune tune --world-size N` exit codes, which a worker reads: 2 (do not retry) for a missing
rank program, 1 (retry) when a rank fails once the ranks run."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from tuner.cli import app


def tune(model: str, tmp_path: Path) -> int:
    args = ["tune", model, "--world-size", "2", "--out", str(tmp_path / "t{rank}.pt2"),
            "--report", str(tmp_path / "report.json"), "--budget-s", "8"]  # fmt: skip
    return CliRunner().invoke(app, args).exit_code


def test_a_missing_rank_program_is_the_callers_error(tmp_path: Path) -> None:
    (tmp_path / "only_rank0.pt2").write_bytes(b"x")
    assert tune(str(tmp_path / "only_rank{rank}.pt2"), tmp_path) == 2


def test_a_rank_that_fails_while_running_exits_1_so_workers_retry(tmp_path: Path) -> None:
    for rank in range(2):  # present, so the ranks start; each raises on loading its program
        (tmp_path / f"bad_rank{rank}.pt2").write_bytes(b"not a program")
    assert tune(str(tmp_path / "bad_rank{rank}.pt2"), tmp_path) == 1
