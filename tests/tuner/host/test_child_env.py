"""What a child's relayed text loses: the caller's secrets and passwords written into URLs."""

from __future__ import annotations

import ctypes
import os
import subprocess
import time

import pytest

from tuner.host.child_env import PR_SET_DUMPABLE, REDACTED, Redactor, undumpable


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("see postgresql://fxtune:hunter2secret@db:5432/x", "postgresql://fxtune:"),
        ("URL=postgresql+psycopg://u:longpassword@h/db", "postgresql+psycopg://u:"),
        ("(https://user:s3cretpass@example.com/)", "https://user:"),
        ("9git://w:tokentoken@h/", "9git://w:"),  # a run starting with a digit still masks
    ],
)
def test_passwords_in_urls_are_masked(text: str, masked: str) -> None:
    out = Redactor()(text)
    assert f"{masked}{REDACTED}@" in out
    assert "secret" not in out and "password" not in out and "tokentoken" not in out


def test_the_callers_secrets_are_masked_wherever_they_appear() -> None:
    out = Redactor(["worker-secret-abcdef", "short"])("a worker-secret-abcdef; short")
    assert out == f"a {REDACTED}; short"  # under 6 characters: would mask ordinary words


def test_a_long_run_of_letters_is_redacted_in_linear_time() -> None:
    """A child's stderr tail is 64 KB; the URL pattern once restarted inside every run of
    letters, 25 s of CPU for that (a minute for this text). It takes milliseconds now."""
    text = "z" * 100_000 + " http://u:passpass@h/"
    start = time.process_time()
    out = Redactor()(text)
    assert time.process_time() - start < 1.0
    assert out.endswith(f"http://u:{REDACTED}@h/")


def _environ_read_by_a_peer(hide: bool) -> str:
    """Fork a process holding a secret in its environment (undumpable if `hide`) and another of
    the same user (nobody's, when the tests run as root) that reads the first's environment."""
    secret_ready, done = os.pipe(), os.pipe()
    holder = os.fork()
    if holder == 0:  # pragma: no cover - the forked child
        os.environ.clear()
        if os.geteuid() == 0:
            os.setgid(65534)
            os.setuid(65534)  # which makes a process undumpable: as one that started so, again
            ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        if hide:
            undumpable()
        os.write(secret_ready[1], b"x")
        os.read(done[0], 1)
        os._exit(0)
    os.read(secret_ready[0], 1)
    peek = subprocess.run(
        ["cat", f"/proc/{holder}/environ"],
        capture_output=True,
        user=65534 if os.geteuid() == 0 else None,
        group=65534 if os.geteuid() == 0 else None,
        check=False,
    )
    os.write(done[1], b"x")
    os.waitpid(holder, 0)
    return "read" if peek.returncode == 0 else "refused"


def test_an_undumpable_process_hides_its_environment_from_its_own_user() -> None:
    """What a tuning child without a sandbox could read of the worker: `/proc/<pid>/environ`
    keeps the environment a process started with, tokens included."""
    assert _environ_read_by_a_peer(hide=False) == "read"
    assert _environ_read_by_a_peer(hide=True) == "refused"
