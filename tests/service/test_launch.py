"""Starting `fxtune serve` on a free port, when another process takes that port first."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from service import launch
from tests.service.helpers import fxtune_env


def test_a_port_taken_before_the_service_binds_it_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An e2e test's service exited with "address already in use": between `free_port` and
    the service's bind, another xdist worker had taken the port. The next port is tried."""
    env = fxtune_env(
        FXTUNE_DATA_DIR=str(tmp_path / "data"),
        FXTUNE_DATABASE_URL=f"sqlite:///{tmp_path / 'fxtune.db'}",
        FXTUNE_WARM_CHECKERS="0",
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports = iter([busy])
        free = launch.free_port
        monkeypatch.setattr(launch, "free_port", lambda: next(ports, None) or free())
        with launch.serve_process(env, tmp_path / "serve.log") as url:
            assert not url.endswith(f":{busy}")
            assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        monkeypatch.setattr(launch, "free_port", lambda: busy)
        with (
            pytest.raises(launch.PortTaken, match="address already in use"),
            launch.serve_process(env, tmp_path / "serve.log"),
        ):
            pass
