"""What `pip install fxtune` asks of a host, per role, and what this project's own installs pin.

The installed wheel itself is exercised in tests/e2e/test_installed_wheel.py; these are the fast
checks of the declarations and of what the light roles import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
SERVICE_ONLY = {"fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "psycopg"}


def names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name for r in requirements}


def torch_requirement() -> Requirement:
    return next(r for r in map(Requirement, PROJECT["dependencies"]) if r.name == "torch")


def test_the_package_declares_the_torch_its_tests_ran_on() -> None:
    """2.13 only: the GPU image's 2.11 joins once the GPU issue has run the suite there."""
    from tuner.host.torch_compat import CHECKED_SERIES

    spec = torch_requirement().specifier
    assert set(spec.filter(["2.11.0", "2.12.1", "2.13.0", "2.13.1", "2.14.0"])) == {
        "2.13.0",
        "2.13.1",
    }
    assert {f"2.{minor}" for minor in range(20) if spec.contains(f"2.{minor}.0")} == set(
        CHECKED_SERIES
    )


def test_the_projects_own_installs_pin_the_tested_torch() -> None:
    pins = [
        Requirement(line)
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    torch = next(r for r in pins if r.name == "torch")
    assert str(torch.specifier) == "==2.13.0"
    assert torch_requirement().specifier.contains("2.13.0")
    makefile = (REPO / "Makefile").read_text()
    assert "torch==2.13.0" in makefile
    assert "-e '.[service,postgres,dev]'" in makefile  # make test needs every role


def test_each_role_gets_what_it_imports_and_no_more() -> None:
    """The base install (tuner, client, worker) has no web server or database; the service's
    extra has them; postgres adds the driver; the runtimes are extras of their own; dev pulls
    every role for the tests."""
    base = names(PROJECT["dependencies"])
    extras = {k: names(v) for k, v in PROJECT["optional-dependencies"].items()}
    assert base == {
        "torch", "numpy", "pandas", "pydantic", "pydantic-settings", "httpx", "typer", "rich"
    }  # fmt: skip
    assert extras["service"] == {
        "fastapi", "uvicorn", "sqlalchemy", "alembic", "jinja2", "python-multipart"
    }  # fmt: skip
    assert extras["postgres"] == {"fxtune", "psycopg"}
    assert {"fxtune", "pytest", "twine", "trove-classifiers"} <= extras["dev"]
    dev_self = next(Requirement(r) for r in PROJECT["optional-dependencies"]["dev"]
                    if r.startswith("fxtune"))  # fmt: skip
    assert dev_self.extras == {"service", "postgres", "openvino", "onnxruntime"}
    # The CPU runtimes are optional: a worker or deployment without them runs without them.
    assert extras["openvino"] == {"openvino"}
    assert extras["onnxruntime"] == {"onnxruntime", "onnx", "onnxscript"}


def _modules_after(statement: str) -> set[str]:
    """Top-level modules loaded by `statement` in a fresh interpreter on this checkout."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    return {m.split(".")[0] for m in json.loads(out.splitlines()[-1])}


def test_the_deployment_client_imports_no_service_and_no_pandas() -> None:
    loaded = _modules_after("import tuner.client")
    assert not (SERVICE_ONLY | {"pandas", "service", "worker"}) & loaded
    assert {"torch", "httpx", "tuner"} <= loaded  # the probe sees real imports


def test_the_worker_and_the_command_import_no_service_dependencies() -> None:
    loaded = _modules_after("import fxtune_cli, worker.loop, worker.cli")
    assert not SERVICE_ONLY & loaded


def _serve_without(blocked: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`fxtune serve` where `blocked` cannot be imported (as in an install without it)."""
    code = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        "from fxtune_cli import main; sys.argv = ['fxtune', 'serve', '--port', '1']; main()"
    )
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=120
    )


def test_serve_without_the_service_extra_says_what_to_install(tmp_path: Path) -> None:
    done = _serve_without("fastapi", FXTUNE_DATA_DIR=str(tmp_path))
    assert done.returncode == 1, done
    assert "pip install 'fxtune[service]'" in done.stderr and "fastapi" in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_on_postgres_without_the_driver_says_what_to_install(tmp_path: Path) -> None:
    url = "postgresql://fxtune@127.0.0.1:1/fxtune"
    done = _serve_without("psycopg", FXTUNE_DATA_DIR=str(tmp_path), FXTUNE_DATABASE_URL=url)
    assert done.returncode == 1, done
    assert "pip install 'fxtune[postgres]'" in done.stderr and "Traceback" not in done.stderr
