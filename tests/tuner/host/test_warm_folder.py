"""A sandboxed `fxtune tune` starts from this user's warm compile caches
(tuner/host/warm_folder.py), built the first time, copied into each run. The warm-up is the
worker tests' stand-in; the real build's effect on a tune is in the closing note."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.worker.fake_tune import WARM_FILE, warm_command
from tuner.host import warm_folder
from tuner.host.sandbox import Limits, Sandbox


def test_built_once_then_reused_and_each_run_gets_its_own_copy(tmp_path: Path) -> None:
    said: list[str] = []
    root = tmp_path / "warm"

    def get() -> Path | None:
        return warm_folder.machine_folder(
            Sandbox(), Limits(60), lambda _f, m: said.append(m), root, warm_command()
        )

    folder = get()
    assert folder is not None and (folder / warm_folder.READY).is_file()
    assert len(said) == 1 and "warming the compile caches once" in said[0]
    assert get() == folder and len(said) == 1  # not built again
    assert [p.name for p in root.iterdir()] == [folder.name]  # no staging folder left
    runs = [tmp_path / "run1", tmp_path / "run2"]
    for run in runs:
        run.mkdir()
        warm_folder.seed(folder, run)
    copied = runs[0] / "tmp" / WARM_FILE
    assert copied.is_file() and not copied.is_symlink()
    copied.write_text("written by a run")
    assert (runs[1] / "tmp" / WARM_FILE).read_text() == "warm"
    assert (folder / "tmp" / WARM_FILE).read_text() == "warm"


def test_a_failed_build_leaves_the_run_cold_and_nothing_half_made(tmp_path: Path) -> None:
    said: list[str] = []
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    root = tmp_path / "warm"
    got = warm_folder.machine_folder(
        Sandbox(), Limits(60), lambda _f, m: said.append(m), root, failing
    )
    assert got is None and "builds cold" in said[-1]
    assert list(root.iterdir()) == []
    unfinished = root / warm_folder._key()  # a folder without READY is built again
    unfinished.mkdir()
    got = warm_folder.machine_folder(Sandbox(), Limits(60), lambda *_: None, root, warm_command())
    assert got == unfinished and (got / "tmp" / WARM_FILE).is_file()


def test_each_installation_has_its_own_folder(monkeypatch) -> None:
    """inductor's header names digest the header paths: another venv's torch (same version)
    cannot use these headers, so it must not share the folder."""
    here = warm_folder._key()
    monkeypatch.setattr(sys, "prefix", "/elsewhere/.venv")
    there = warm_folder._key()
    assert there != here and there.rsplit("-", 1)[0] == here.rsplit("-", 1)[0]


def test_only_old_folders_of_other_installations_beyond_three_are_pruned(tmp_path: Path) -> None:
    now = 1_000_000.0
    folders = []
    for i in range(6):  # folder i last used i days (and a minute) ago
        folder = tmp_path / f"torch-x-{i}"
        (folder / "tmp").mkdir(parents=True)
        (folder / warm_folder.READY).write_text("")
        used = now - i * 86400 - 60
        os.utime(folder / warm_folder.READY, (used, used))
        folders.append(folder)
    (tmp_path / ".building-abc").mkdir()  # another run's build in progress
    removed = warm_folder.prune(tmp_path, keep=folders[5], now=now)
    # kept: folders[5] (in use) and the three most recent others (0, 1, 2); 3 and 4 go
    assert sorted(removed) == [folders[3], folders[4]]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".building-abc",
        "torch-x-0",
        "torch-x-1",
        "torch-x-2",
        "torch-x-5",
    ]
