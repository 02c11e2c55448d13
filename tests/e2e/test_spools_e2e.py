"""A service killed with -9 in the middle of an upload: the next start removes its spool."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.launch import serve_process
from tests.service.helpers import children, fxtune_env, pid_alive, wait_for

pytestmark = pytest.mark.e2e


def stalled_upload(url: str, release: threading.Event) -> None:
    def body() -> Iterator[bytes]:
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="x.pt2"\r\n\r\n'
        yield b"x" * 65536
        release.wait(60)

    with contextlib.suppress(httpx.HTTPError):
        httpx.post(
            f"{url}/api/v1/models",
            content=body(),
            headers={"content-type": "multipart/form-data; boundary=b"},
            timeout=60,
        )


def test_a_spool_left_by_kill_9_is_gone_after_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = fxtune_env(FXTUNE_DATA_DIR=str(data))
    spools = data / "artifacts" / "tmp"
    before = set(children(os.getpid()))
    release = threading.Event()
    with serve_process(env, tmp_path / "first.log") as url:
        (pid,) = set(children(os.getpid())) - before
        sender = threading.Thread(target=stalled_upload, args=(url, release), daemon=True)
        sender.start()
        left = wait_for(lambda: list(spools.glob("upload-*.part")), 30, "the upload's spool")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 30, "the service to die")
        release.set()
        sender.join(30)
    assert all(p.exists() for p in left)  # kill -9 ran no clean-up: the spool is still there
    with serve_process(env, tmp_path / "second.log") as url:
        assert list(spools.glob("upload-*.part")) == []
        assert httpx.get(f"{url}/api/v1/models").json() == []
