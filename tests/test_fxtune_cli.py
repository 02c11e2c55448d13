"""The `fxtune` command itself: `--version`, and what a wrong model file gets on the CLI (the
same message as the upload API's, with the exit code of tuner.contract.exit_codes)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fxtune_cli import app
from tests.wrong_files import WRONG_FILES
from tuner.contract.exit_codes import ExitCode
from tuner.host.versions import OPTIONAL_RUNTIMES, distribution_version


def test_version_names_fxtune_torch_and_each_optional_runtime() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"fxtune {distribution_version('fxtune')}"
    assert lines[1] == f"torch {distribution_version('torch')}"
    runtimes = {line.split()[0]: line.split(maxsplit=1)[1] for line in lines[3:]}
    assert set(runtimes) == set(OPTIONAL_RUNTIMES)
    for name, distributions in OPTIONAL_RUNTIMES.items():
        assert runtimes[name] == (distribution_version(*distributions) or "not installed")


@pytest.mark.parametrize(("what", "make", "message"), WRONG_FILES, ids=[w[0] for w in WRONG_FILES])
def test_a_wrong_file_gets_the_message_and_exit_code_2(
    tmp_path: Path, what: str, make: Callable[[Path], Path], message: str
) -> None:
    result = CliRunner().invoke(app, ["sites", str(make(tmp_path))])
    assert result.exit_code == ExitCode.USER_INPUT
    assert result.output.strip() == f"error: {message}"  # one line: long messages are not wrapped


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pt2"
    result = CliRunner().invoke(app, ["sites", str(missing)])
    assert result.exit_code == ExitCode.USER_INPUT
    expected = f"error: no such file: {missing} (pass the .pt2 file torch.export.save wrote)"
    assert result.output.strip() == expected
