"""The tuner's child process: progress relay, limits, and nothing left running afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.helpers import REPO, pid_alive, wait_for
from tuner.host.child_env import REDACTED, Redactor
from tuner.host.sandbox import (
    Limits,
    Sandbox,
    SandboxUnavailable,
    bwrap_works,
    choose_sandbox,
    error_line,
    python_paths,
    resolve_sandbox,
    run_child,
)


def no_progress(fraction: float, message: str) -> None:
    """The progress callback of a child whose progress the test does not read."""


def py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_progress_lines_are_relayed_and_noise_ignored(tmp_path: Path) -> None:
    seen: list[tuple[float, str]] = []
    code = """
        import json
        print("loading torch...")
        for i in range(3):
            print(json.dumps({"progress": i / 2, "message": f"step {i}"}), flush=True)
        print("{broken json")
    """
    result = run_child(py(code), Limits(wall_s=30), tmp_path, lambda p, m: seen.append((p, m)))
    assert result.ok and result.error is None
    assert seen == [(0.0, "step 0"), (0.5, "step 1"), (1.0, "step 2")]


def test_a_failure_reports_the_error_block_or_the_last_line(tmp_path: Path) -> None:
    code = """
        import sys
        sys.stderr.write("warn\\nerror: refused to load x:\\n  it pickles\\n")
        sys.exit(2)
    """
    result = run_child(py(code), Limits(wall_s=30), tmp_path, no_progress)
    assert result.returncode == 2 and result.error == "error: refused to load x: it pickles"
    result = run_child(py("raise KeyError('k')"), Limits(wall_s=30), tmp_path, no_progress)
    assert result.returncode == 1 and result.error == "KeyError: 'k'"
    assert error_line("\n\n") is None


def test_a_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    code = f"""
        import subprocess, time
        p = subprocess.Popen(["sleep", "600"])
        open({str(pid_file)!r}, "w").write(str(p.pid))
        time.sleep(600)
    """
    started = time.monotonic()
    result = run_child(py(code), Limits(wall_s=1.5), tmp_path, no_progress)
    assert time.monotonic() - started < 10
    assert result.timed_out and not result.ok and "timed out after 1.5s" in (result.error or "")
    grandchild = int(pid_file.read_text())
    wait_for(lambda: not pid_alive(grandchild), 5, "the grandchild to die")


def test_the_address_space_limit_stops_a_memory_hog(tmp_path: Path) -> None:
    code = "x = bytearray(2 * 1024**3)"
    limits = Limits(wall_s=30, address_space_bytes=512 * 1024**2)
    result = run_child(py(code), limits, tmp_path, no_progress)
    assert result.returncode == 1 and result.error == "MemoryError"


def test_the_cpu_time_limit_stops_a_spinning_tuner(tmp_path: Path) -> None:
    result = run_child(py("while True: pass"), Limits(wall_s=60, cpu_s=1), tmp_path, no_progress)
    assert result.returncode == -signal.SIGXCPU and "SIGXCPU" in (result.error or "")


def test_the_tuner_dies_with_its_worker(tmp_path: Path) -> None:
    """kill -9 on the worker must not leave an orphan tuning on (PR_SET_PDEATHSIG)."""
    pid_file = tmp_path / "child.pid"
    child = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    )
    parent = f"""
        import sys
        from pathlib import Path
        from tuner.host.sandbox import Limits, run_child
        run_child([sys.executable, "-c", {child!r}], Limits(wall_s=600), Path({str(tmp_path)!r}),
                  lambda p, m: None)
    """
    proc = subprocess.Popen(py(parent), cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the child to start")
        tuner = int(pid_file.read_text())
        assert pid_alive(tuner)
        proc.kill()
        proc.wait()
        wait_for(lambda: not pid_alive(tuner), 5, "the orphaned tuner to die")
    finally:
        proc.kill()


def test_a_missing_tuner_is_an_error_not_a_crash(tmp_path: Path) -> None:
    result = run_child(["/nonexistent/fxtune"], Limits(wall_s=5), tmp_path, no_progress)
    assert not result.ok and "cannot start the tuner" in (result.error or "")


PROBE = """
import json, os, socket, tempfile, sys
port, outside = int(sys.argv[1]), sys.argv[2]
out = {"tmpdir": tempfile.mkdtemp(), "tmp_listing": sorted(os.listdir("/tmp"))}
try:
    open(outside, "w").write("escaped")
except OSError:
    pass
try:
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    out["connected"] = True
except OSError:
    out["connected"] = False
open("probe.json", "w").write(json.dumps(out))
"""


@contextlib.contextmanager
def listening() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        yield srv.getsockname()[1]


def probe(tmp_path: Path, sandbox: Sandbox) -> dict[str, object]:
    workdir, outside = tmp_path / "job", tmp_path / "outside.txt"
    workdir.mkdir()
    with listening() as port:
        cmd = [sys.executable, "-c", PROBE, str(port), str(outside)]
        result = run_child(cmd, Limits(wall_s=60), workdir, no_progress, sandbox=sandbox)
    assert result.ok, result.error
    found = json.loads((workdir / "probe.json").read_text())
    found["escaped"] = outside.exists()  # on the host, not in the sandbox's own /tmp
    assert Path(str(found["tmpdir"])).is_relative_to(workdir / "tmp")  # private TMPDIR
    return found


@pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot run on this machine")
def test_bubblewrap_keeps_the_child_off_the_disk_and_the_network(tmp_path: Path) -> None:
    found = probe(tmp_path, choose_sandbox("bwrap"))
    assert found["escaped"] is False
    assert found["connected"] is False
    # /tmp is its own: only the mount points of the job folder and of the Python environment,
    # where those lie below /tmp (a checkout there)
    bound = [(tmp_path / "job").resolve(), *(p.resolve() for p in python_paths())]
    mounts = {p.parts[2] for p in bound if p.is_relative_to("/tmp") and len(p.parts) > 2}
    assert set(found["tmp_listing"]) == mounts


def test_without_bubblewrap_the_same_child_reaches_both(tmp_path: Path) -> None:
    """Control for the test above, and what `FXTUNE_WORKER_SANDBOX=none` gives up."""
    found = probe(tmp_path, choose_sandbox("none"))
    assert found["escaped"] is True
    assert found["connected"] is True


def test_without_bubblewrap_only_an_explicit_none_runs_unsandboxed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`auto` no longer falls back quietly: it refuses like `bwrap`, and says what to do."""
    monkeypatch.setattr("tuner.host.sandbox.shutil.which", lambda _name: None)
    bwrap_works.cache_clear()
    try:
        for mode in ("auto", "bwrap"):
            with pytest.raises(SandboxUnavailable, match=r"install Debian's `bubblewrap`.*=none"):
                resolve_sandbox(mode)  # type: ignore[arg-type]
        assert choose_sandbox("none").kind == "none"
    finally:
        bwrap_works.cache_clear()


LOOPBACK = """
import socket
srv = socket.create_server(("127.0.0.1", 0))
with socket.create_connection(srv.getsockname(), timeout=5) as c, srv.accept()[0] as peer:
    c.sendall(b"rank")
    open("loopback.txt", "wb").write(peer.recv(4))
"""


@pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot run on this machine")
def test_bubblewrap_keeps_loopback_inside_the_sandbox_for_distributed_ranks(
    tmp_path: Path,
) -> None:
    """gloo ranks of one job meet on 127.0.0.1 in the sandbox's own network namespace."""
    cmd = [sys.executable, "-c", LOOPBACK]
    sandbox = choose_sandbox("bwrap")
    result = run_child(cmd, Limits(wall_s=60), tmp_path, no_progress, sandbox=sandbox)
    assert result.ok, result.error
    assert (tmp_path / "loopback.txt").read_bytes() == b"rank"


SNOOP = """
import json, os, sys
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = os.listdir(name) if os.path.isdir(name) else open(name).read()
    except OSError as exc:
        out[name] = type(exc).__name__
open("snoop.json", "w").write(json.dumps(out))
"""


@pytest.fixture
def machine() -> Iterator[dict[str, Path]]:
    """A worker's machine outside /tmp (whose private copy would hide it anyway): the
    service's data folder, this job's and another job's folder, the decision cache, a file in
    the folder above them all (as the home folder would be)."""
    root = Path(tempfile.mkdtemp(prefix="fxtune-sandbox-test-", dir=Path.home()))
    try:
        paths = {
            "root_file": root / "notes.txt",
            "database": root / "data" / "fxtune.db",
            "upload": root / "data" / "artifacts" / "blobs" / "ab" / "abcdef",
            "job": root / "scratch" / "fxtune-job1-x",
            "other_job": root / "scratch" / "fxtune-job2-y",
            "other_input": root / "scratch" / "fxtune-job2-y" / "input.pt2",
            "cache": root / "cache" / "decisions.json",
        }
        for name, path in paths.items():
            if name in ("job", "other_job"):
                path.mkdir(parents=True, exist_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(f"{name} contents")
        yield paths
    finally:
        shutil.rmtree(root)


def snoop(machine: dict[str, Path], sandbox: Sandbox) -> dict[str, object]:
    targets = ["root_file", "database", "upload", "other_job", "other_input", "cache"]
    cmd = [sys.executable, "-c", SNOOP, *(str(machine[t]) for t in targets)]
    result = run_child(cmd, Limits(wall_s=60), machine["job"], no_progress, sandbox=sandbox)
    assert result.ok, result.error
    found = json.loads((machine["job"] / "snoop.json").read_text())
    return {t: found[str(machine[t])] for t in targets}


@pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot run on this machine")
def test_bubblewrap_hides_the_data_folder_home_and_other_jobs(machine: dict[str, Path]) -> None:
    sandbox = Sandbox("bwrap", (machine["cache"].parent,))
    found = snoop(machine, sandbox)
    for hidden in ("root_file", "database", "upload", "other_job", "other_input"):
        assert found[hidden] == "FileNotFoundError", (hidden, found[hidden])
    assert found["cache"] == "cache contents"  # the decision cache stays readable (and writable)


def test_without_a_sandbox_the_same_child_reads_them_all(machine: dict[str, Path]) -> None:
    """Control for the test above: the paths exist and the child can read them unsandboxed."""
    found = snoop(machine, Sandbox("none"))
    assert found["database"] == "database contents" and found["upload"] == "upload contents"
    assert found["other_job"] == ["input.pt2"] and found["root_file"] == "root_file contents"


@pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot run on this machine")
def test_bubblewrap_binds_the_system_and_python_not_the_root() -> None:
    args = Sandbox("bwrap").binds(Path("/tmp/job"), [Path(sys.prefix)])
    bound = {args[i + 1] for i, a in enumerate(args) if a in ("--ro-bind", "--bind")}
    assert "/" not in bound and str(Path.home()) not in bound
    assert "/usr" in bound
    prefix = Path(sys.prefix).resolve()
    assert str(prefix) in bound or prefix.is_relative_to("/usr")


@pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot run on this machine")
def test_a_program_kept_under_tmp_still_runs_in_the_sandbox(tmp_path: Path) -> None:
    """A checkout (and its venv) under /tmp: the sandbox's own /tmp must not hide it."""
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        tool = Path(tmp) / "venv" / "bin" / "tool"
        tool.parent.mkdir(parents=True)
        tool.write_text("#!/bin/sh\necho ran > ran.txt\n")
        tool.chmod(0o755)
        workdir = tmp_path / "job"
        workdir.mkdir()
        sandbox = choose_sandbox("bwrap")
        limits = Limits(wall_s=60)
        result = run_child([str(tool)], limits, workdir, no_progress, sandbox=sandbox)
        assert result.ok, result.error
        assert (workdir / "ran.txt").read_text() == "ran\n"


@pytest.mark.parametrize("kind", ["none", "bwrap"])
def test_a_child_killed_by_a_signal_says_so_in_or_out_of_the_sandbox(
    tmp_path: Path, kind: str
) -> None:
    """bubblewrap exits 128+N for a command killed by signal N; the result reads as Popen's -N."""
    if kind == "bwrap" and not bwrap_works():
        pytest.skip("bubblewrap cannot run on this machine")
    cmd = py("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    sandbox = choose_sandbox(kind)  # type: ignore[arg-type]
    result = run_child(cmd, Limits(wall_s=60), tmp_path, no_progress, sandbox=sandbox)
    assert result.returncode == -signal.SIGSEGV
    assert result.error == "tuner killed by SIGSEGV"
    exits_139 = run_child(py("raise SystemExit(139)"), Limits(wall_s=60), tmp_path, no_progress)
    assert exits_139.returncode == 139  # control: unwrapped, a status is a status


ENV_DUMP = "import json, os; open('env.json', 'w').write(json.dumps(dict(os.environ)))"
SECRETS = {
    "FXTUNE_WORKER_TOKEN": "worker-secret-123456",
    "FXTUNE_API_TOKEN": "user-secret-123456",
    "FXTUNE_DATABASE_URL": "postgresql://fx:dbpass-123456@db/fx",
    "SOME_PASSWORD": "hunter2-123456",
    "AWS_SECRET_ACCESS_KEY": "aws-123456",
    "UNLISTED_VARIABLE": "not for children",
}


@pytest.mark.parametrize("kind", ["none", "bwrap"])
def test_the_child_gets_an_allowlisted_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    if kind == "bwrap" and not bwrap_works():
        pytest.skip("bubblewrap cannot run on this machine")
    for name, value in {**SECRETS, "OMP_NUM_THREADS": "3", "CUDA_VISIBLE_DEVICES": "1"}.items():
        monkeypatch.setenv(name, value)
    assert os.environ["FXTUNE_WORKER_TOKEN"]  # the parent has them all (the control)
    passed = {"FAKE_KNOB": "on", "MY_TOKEN": "passed-secret-123456"}
    cmd = [sys.executable, "-c", ENV_DUMP]
    result = run_child(
        cmd,
        Limits(wall_s=60),
        tmp_path,
        no_progress,
        env=passed,
        sandbox=Sandbox(kind),  # type: ignore[arg-type]
    )
    assert result.ok, result.error
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["HOME"] == str(tmp_path) and env["TMPDIR"] == str(tmp_path / "tmp")
    assert env["OMP_NUM_THREADS"] == "3" and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["FAKE_KNOB"] == "on" and "PATH" in env
    assert not set(SECRETS) & set(env) and "MY_TOKEN" not in env
    dumped = json.dumps(env)
    assert not [v for v in [*SECRETS.values(), "passed-secret-123456"] if v in dumped]


LEAKY = """
import json, sys
token = sys.argv[1]
print(json.dumps({"progress": 0.5, "message": f"using {token} and http://u:{token}@host/"}))
print(json.dumps({"progress": 0.6, "message": "x" * 10_000}))
print("y" * 200_000)
print(json.dumps({"progress": 0.7, "message": "after a long line"}), flush=True)
sys.stderr.write("z" * 100_000 + "\\nerror: the token is " + token + "\\n")
sys.exit(2)
"""


def test_relayed_text_is_capped_and_the_callers_secrets_masked(tmp_path: Path) -> None:
    token = "worker-secret-abcdef"
    seen: list[tuple[float, str]] = []
    cmd = [sys.executable, "-c", LEAKY, token]
    redact = Redactor([token])
    result = run_child(
        cmd, Limits(wall_s=60), tmp_path, lambda p, m: seen.append((p, m)), redact=redact
    )
    assert result.returncode == 2 and result.error == f"error: the token is {REDACTED}"
    assert [p for p, _ in seen] == [0.5, 0.6, 0.7]  # the 200 KB line was skipped
    assert seen[0][1] == f"using {REDACTED} and http://u:{REDACTED}@host/"
    assert len(seen[1][1]) == 500
    assert token not in json.dumps(seen)
    unmasked: list[tuple[float, str]] = []
    run_child(cmd, Limits(wall_s=60), tmp_path, lambda p, m: unmasked.append((p, m)))
    assert token in unmasked[0][1]  # the control: without the caller's redactor it shows


def test_a_stuck_childs_stacks_are_read_from_its_stderr() -> None:
    """`fxtune tune` dumps its stacks a minute past its budget (faulthandler); a job stopped or
    timed out after that says where the child was, innermost frame first."""
    from tuner.host.sandbox import overrun_stacks

    code = (
        "import faulthandler, time\n"
        "def stuck():\n"
        "    time.sleep(3)\n"
        "faulthandler.dump_traceback_later(0.3)\n"
        "stuck()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    where = overrun_stacks("some warning\n" + done.stderr)
    assert where is not None and where.startswith('File "<string>", line 3 in stuck'), where
    assert overrun_stacks("an ordinary error\n") is None


def test_the_folders_bound_for_the_child_are_found_without_importing_torch() -> None:
    """A worker (which never imports torch) builds each job's sandbox: importing torch there
    cost seconds before the first job's first heartbeat, longer than a short lease."""
    code = (
        "import sys; from tuner.host.sandbox import python_paths; paths = python_paths(); "
        "print('torch' in sys.modules, any((p / 'torch' / '__init__.py').is_file() for p in paths))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split() == ["False", "True"], done
