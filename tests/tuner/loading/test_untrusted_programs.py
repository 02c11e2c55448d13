"""The routes from a program JSON to a compiler (Python's three, Inductor's C++ one), and the
resource bombs.

Each Python exploit is first shown to work against plain `torch.export.load(...).module()` (the
control: the marker file appears; the C++ route's control, which needs a compile, is in
test_op_string_args.py), then every route is refused by fxtune's loader and by `fxtune sites`
(exit 3) with no marker.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.crafted import CODE_MARKER
from tuner.contract.errors import UnsafeArtifactError
from tuner.loading.load import load_program

PYTHON_ROUTES = {
    "expression_exec": "expr_str",
    "guard_exec": "guards_code",
    "name_exec": "parameter_name",
}
ROUTES = {**PYTHON_ROUTES, "assert_message": "assert_msg"}
BOMBS = {
    "zeros_bomb": "makes a tensor of 4096.0 GiB",
    "matmul_chain": "FLOPs",
    "strided_weight": "zero or overlapping strides",
}


def _marker(hostile: dict[str, Path]) -> Path:
    return hostile["good"].parent / CODE_MARKER


@pytest.mark.parametrize("name", sorted(PYTHON_ROUTES))
def test_plain_torch_runs_the_planted_code(hostile: dict[str, Path], name: str) -> None:
    """The control: each crafted file really is an exploit for torch's own loader."""
    marker = _marker(hostile)
    marker.unlink(missing_ok=True)
    try:
        module = torch.export.load(hostile[name]).module()
        batch = 4 if name != "name_exec" else 2  # name_exec is built from the static program
        with contextlib.suppress(AttributeError):  # name_exec's getattr fails after its exec
            module(torch.randn(batch, 16))
        assert marker.exists(), f"{name} did not run code under plain torch.export.load"
    finally:
        marker.unlink(missing_ok=True)


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_fxtune_refuses_each_route_before_torch_sees_it(
    hostile: dict[str, Path], name: str
) -> None:
    marker = _marker(hostile)
    marker.unlink(missing_ok=True)
    with pytest.raises(UnsafeArtifactError, match=ROUTES[name]):
        load_program(hostile[name])
    assert not marker.exists()


SitesRun = tuple[subprocess.CompletedProcess[str], float, int, bool]
# `fxtune sites FILE` for every file, each in a process of its own forked from one that has
# imported what the command imports (torch: about 3 s of CPU a process, paid once here, its time
# added to each run's wall time). A forked run starts with that process's memory, so its peak
# resident memory counts torch's import as a fresh `fxtune sites` does.
SITES = textwrap.dedent(
    """
    import json, os, sys, time, traceback
    started = time.monotonic()
    import torch
    import fxtune_cli, tuner.cli, tuner.graph.capture, tuner.loading.bounds, tuner.passes
    import_s = time.monotonic() - started
    runs = {}
    marker = sys.argv[2]
    for name, path, folder in json.loads(sys.argv[1]):
        if os.path.exists(marker):
            os.unlink(marker)
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:  # as `python -c "from fxtune_cli import main; main()" sites PATH`
            code = 1
            try:
                for fd, what in ((1, "stdout"), (2, "stderr")):
                    os.dup2(os.open(os.path.join(folder, what), os.O_WRONLY | os.O_CREAT), fd)
                sys.argv = ["fxtune", "sites", path]
                fxtune_cli.main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                status = open("/proc/self/status").read()
                with open(os.path.join(folder, "peak"), "w") as f:
                    f.write(status.split("VmHWM:")[1].split()[0])
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        wall_s = import_s + time.monotonic() - start
        code = os.waitstatus_to_exitcode(status)
        runs[name] = {"returncode": code, "wall_s": wall_s, "marker": os.path.exists(marker)}
    print(json.dumps(runs))
    """
)


@pytest.fixture(scope="module")
def sites_runs(
    hostile: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, SitesRun]:
    """Every file's `fxtune sites` run: the process, its wall time, its own peak resident
    memory (KiB, the process's VmHWM: getrusage's ru_maxrss survives exec, so after
    subprocess's vfork it reported the (large) pytest parent's peak on CI), and whether the
    exploits' marker (removed before each run) was there after it."""
    root = tmp_path_factory.mktemp("sites")
    jobs = []
    for name in [*sorted(ROUTES), *sorted(BOMBS), "good"]:
        (root / name).mkdir()
        jobs.append((name, str(hostile[name]), str(root / name)))
    cmd = [sys.executable, "-c", SITES, json.dumps(jobs), str(_marker(hostile))]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    found = {}
    for name, _, folder in jobs:
        out = Path(folder)
        process = subprocess.CompletedProcess(
            ["fxtune", "sites", str(hostile[name])],
            runs[name]["returncode"],
            (out / "stdout").read_text(),
            (out / "stderr").read_text(),
        )
        peak_kb = int((out / "peak").read_text())
        found[name] = (process, runs[name]["wall_s"], peak_kb, runs[name]["marker"])
    return found


@pytest.mark.parametrize("name", sorted(ROUTES) + sorted(BOMBS))
def test_fxtune_sites_exits_3_with_the_reason(sites_runs: dict[str, SitesRun], name: str) -> None:
    done, wall_s, peak_kb, marker_written = sites_runs[name]
    assert done.returncode == 3, done.stderr
    assert "refused" in done.stderr
    why = ROUTES.get(name) or BOMBS[name]
    assert why in " ".join(done.stderr.split()), done.stderr
    assert not marker_written
    if name in BOMBS:  # the whole command, torch's import included
        assert wall_s < 30 and peak_kb < 1024**2, (wall_s, peak_kb)


def test_the_good_programs_still_load_and_list_sites(
    hostile: dict[str, Path],
    sites_runs: dict[str, SitesRun],
) -> None:
    """The refusals are specific: the untouched sources of every exploit pass."""
    for name, batch in (("good", 2), ("dynamic", 4), ("dynamic", 7)):
        program = load_program(hostile["good"].parent / f"{name}.pt2")
        assert program.module()(torch.randn(batch, 16)).shape == (batch, 16)
    done, _, _, _ = sites_runs["good"]
    assert done.returncode == 0, done.stderr
