"""Root fixtures: a throw-away PostgreSQL on loopback, a database URL per backend, the crafted
hostile files, the small sharded model's programs, and strict fallbacks for the whole suite.

The PostgreSQL server starts once per session, only when a test asks for it, with `initdb` and
`pg_ctl` (as user `postgres` when the tests run as root). FXTUNE_TEST_POSTGRES_URL points the
suite at an existing server instead (a URL to a database the user may create databases from).

The suite runs with FXTUNE_STRICT=1 (`tuner.host.failures`): an unexpected exception in a pass,
a backend, the loader or the search raises instead of becoming a "failed to run" verdict, so a
bug fails its test. It is set here, before anything reads it, and the children the tests start
inherit it (`tuner.host.child_env` lets it through). A test that provokes a fallback on purpose
asks for `allow_fallbacks` and says which fallback it exercises.

`fxtune tune` runs without its sandbox in the tests' process (FXTUNE_TUNE_SANDBOX=0): the tests
that call it in-process register passes and patch the tuner there; the sandboxed command has
tests of its own.

In-process services start no warm checkers (FXTUNE_WARM_CHECKERS=0): each is a sandboxed child
that imports torch (about 5 s of CPU) as the app starts, and most service tests never upload, so
on 2 cores they cost the suite minutes. Checks run in a cold child instead, the same code; the
tests of the warm pool ask for one (tests/service/test_warm_*.py), and the services the
end-to-end tests start as subprocesses keep the shipped default (`fxtune_env` drops FXTUNE_*).

Comparisons that name no stopping rule stop at a 15 % interval or 20 rounds, not at 2 % or
200 (`tuner.measure.timing.StopSettings`, tests/run_settings.py), in this process and in the
services and workers the tests start: tests/tuner/tuning, search and backends took 496 s of CPU
with the shipped rule, 365 s at 5 % and 60 rounds, and 249 s of wall time at 5 % and 60 against
217 s at 10 % and 30 (2 workers); with 3 workers, 311 s of CPU at 10 % and 30 against 285 s at
15 % and 20 (164 and 148 s of wall time). The tests of the round loop name their rules; `make
bench` times with the shipped ones.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.launch import free_port
from tests import parallel
from tests.reruns import FirstFailures
from tests.run_settings import RUN_CACHE_ENV, RUN_TIMING
from tuner.host import failures

os.environ[failures.STRICT_ENV] = "1"
os.environ["FXTUNE_WARM_CHECKERS"] = "0"
# `fxtune tune` in the tests' own process tunes in that process (fixtures register passes there);
# tests/tuner/host/test_sandboxed_tune.py runs it sandboxed, as it runs by default.
os.environ["FXTUNE_TUNE_SANDBOX"] = "0"
# Its sandboxed runs start cold: the warm folder's real build is a 30 s compile
# (tests/tuner/host/test_warm_folder.py uses a stand-in).
os.environ["FXTUNE_TUNE_WARM_CACHES"] = "0"
os.environ["FXTUNE_WORKER_WARM_COMMAND"] = "[]"  # see tests/service/helpers.fxtune_env
os.environ.update(RUN_TIMING)  # `tuner.measure.timing.StopSettings`: tests/run_settings.py


@dataclass
class Postgres:
    """A server we may create databases on; each test gets a fresh database."""

    admin_url: str  # postgresql+psycopg://user@host:port/postgres
    _names = itertools.count()

    def new_database(self) -> str:
        import psycopg

        name = f"fxtune_test_{os.getpid()}_{next(self._names)}"
        dsn = self.admin_url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.admin_url.rsplit("/", 1)[0] + f"/{name}"


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def postgres_bin() -> Path | None:
    """The folder of `initdb` and `pg_ctl`: on PATH, else Debian's newest server's."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return debian[-1].parent if debian else None


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    external = os.environ.get("FXTUNE_TEST_POSTGRES_URL")
    if external:
        yield Postgres(external.replace("postgresql://", "postgresql+psycopg://", 1))
        return
    bindir = postgres_bin()
    if bindir is None:
        if os.environ.get("CI") == "true":  # CI installs it (.ci/run): missing is a failure there
            pytest.fail("PostgreSQL is not installed, and CI must run the PostgreSQL tests")
        pytest.skip("PostgreSQL is not installed (no initdb on PATH or in /usr/lib/postgresql)")
    root = Path(tempfile.mkdtemp(prefix="fxtune-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data, port = root / "data", free_port()
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "check": True}
    subprocess.run(
        _as_postgres(
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ]
        ),
        **quiet,
    )
    options = (
        f"-h 127.0.0.1 -p {port} -k {root} -F -c max_connections=300 "
        "-c synchronous_commit=off -c full_page_writes=off"
    )
    subprocess.run(
        _as_postgres(
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(root / "log"),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            ]
        ),
        **quiet,
    )
    try:
        yield Postgres(f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres")
    finally:
        subprocess.run(
            _as_postgres(
                [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def run_local_decision_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One decision cache per test process (each xdist worker), empty when the run starts, in
    place of ~/.cache/fxtune (tests/run_settings.py)."""
    path = tmp_path_factory.mktemp("fxtune-cache") / "decisions.json"
    with pytest.MonkeyPatch.context() as patch:
        for name in RUN_CACHE_ENV:
            patch.setenv(name, str(path))
        yield path


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto`: one worker more than the cores this process may use (tests/parallel.py says
    why); PYTEST_XDIST_AUTO_NUM_WORKERS, xdist's own override, still wins."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return parallel.workers_for(len(os.sched_getaffinity(0)))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """`make test`'s serial run imports only the test files that name the mark."""
    if config.option.markexpr not in parallel.SERIAL_RUNS:
        return None
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    return not parallel.names_serial_mark(collection_path) or None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files are handed out longest first (tests/parallel.py). Tests marked `cuda` skip where torch
    sees no CUDA device (`pytest -m cuda` selects them on a GPU machine, and `make gpu-check`
    runs them there)."""
    parallel.check_serial_marks(items)
    parallel.longest_files_first(items)
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in marked:
        item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A `serial` test runs with no other test beside it (tests/parallel.py)."""
    turns = _turns(item.config)
    serial = item.get_closest_marker("serial") is not None
    next_serial = nextitem is not None and nextitem.get_closest_marker("serial") is not None
    slow = item.get_closest_marker("slow") is not None
    with turns.turn(item.nodeid, serial, next_serial, slow):
        return (yield)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(FirstFailures(), "fxtune-first-failures")  # tests/reruns.py


def _turns(config: pytest.Config) -> parallel.Turns:
    """This process's turns, made on first use."""
    if parallel.TURNS not in config.stash:
        timeline = os.environ.get("FXTUNE_TEST_TIMELINE")
        folder = parallel.lock_folder(config)
        config.stash[parallel.TURNS] = parallel.Turns(folder, Path(timeline) if timeline else None)
    return config.stash[parallel.TURNS]


@pytest.fixture(scope="session")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The crafted hostile files (tests/crafted.py), built once per session: defined here, not
    imported into each test module, where pytest would build a session fixture once per module."""
    from tests.crafted import hostile_files  # torch: not for the xdist controller

    return hostile_files(tmp_path_factory.mktemp("hostile"))


@pytest.fixture(scope="session")
def sharded_2(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The small sharded model's two rank programs (tests/sharded_helpers.py), exported once per
    session on a real gloo group: the path pattern, `{rank}` in it. Tests only read them."""
    from tests.sharded_helpers import build_small

    return build_small(tmp_path_factory.mktemp("sharded"), 2)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same test on the embedded default (SQLite) and the scale-out backend (PostgreSQL)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fxtune.db'}"
    return request.getfixturevalue("postgres").new_database()


@pytest.fixture
def allow_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unexpected exceptions become verdicts again (as outside the tests), in this process and
    in the children it starts: for a test that provokes such a fallback on purpose."""
    monkeypatch.setattr(failures, "settings", lambda: failures.FailureSettings(strict=False))
    monkeypatch.setenv(failures.STRICT_ENV, "0")
