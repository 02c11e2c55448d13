"""docker-compose.yml and the Dockerfile use only commands, options, settings and routes
that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import typer
import yaml
from fastapi.testclient import TestClient

from fxtune_cli import app as cli_app
from service.core.config import Settings
from service.main import create_app
from tests.service.helpers import LOCAL
from worker.config import WorkerSettings

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
SETTINGS = {
    f"FXTUNE_{name.upper()}" for name in (*Settings.model_fields, *WorkerSettings.model_fields)
}


def check_fxtune_command(argv: list[str]) -> None:
    """Parse argv with the real CLI (no command runs): unknown commands or options raise."""
    assert argv[0] == "fxtune", argv
    group = typer.main.get_command(cli_app)
    with group.make_context("fxtune", list(argv[1:2])) as ctx:
        command = group.get_command(ctx, argv[1])
        assert command is not None, f"no command {argv[1]!r}"
        command.make_context(argv[1], list(argv[2:]), parent=ctx)


def healthcheck_urls(service: dict[str, Any]) -> list[str]:
    test = service.get("healthcheck", {}).get("test", [])
    return re.findall(r"https?://[^'\" ]+", " ".join(test))


@pytest.mark.parametrize("name", [n for n, s in SERVICES.items() if "command" in s])
def test_commands_exist_with_their_options(name: str) -> None:
    check_fxtune_command(SERVICES[name]["command"])


def test_the_image_default_command_exists() -> None:
    cmd = next(ln for ln in (REPO / "Dockerfile").read_text().splitlines() if ln.startswith("CMD"))
    check_fxtune_command(json.loads(cmd.removeprefix("CMD")))


def test_a_misspelt_option_would_be_caught() -> None:
    with pytest.raises(Exception, match="sever") as caught:
        check_fxtune_command(["fxtune", "worker", "--device", "cpu", "--sever", "http://x"])
    assert getattr(caught.value, "exit_code", None) == 2  # click's usage error


@pytest.mark.parametrize("name", list(SERVICES))
def test_every_fxtune_variable_is_a_setting(name: str) -> None:
    env = SERVICES[name].get("environment", {})
    used = {k for k in env if k.startswith("FXTUNE_")}
    assert used <= SETTINGS, used - SETTINGS


def test_urls_point_at_compose_services_and_real_routes(tmp_path: Path) -> None:
    urls = [u for s in SERVICES.values() for u in healthcheck_urls(s)]
    for s in SERVICES.values():
        urls += [a for a in s.get("command", []) if a.startswith("http")]
        urls += [v for k, v in s.get("environment", {}).items() if k == "FXTUNE_DATABASE_URL"]
    assert urls
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'db.sqlite'}")
    with TestClient(create_app(settings), base_url=LOCAL, client=("127.0.0.1", 1)) as client:
        for url in urls:
            parsed = urlparse(url)
            assert parsed.hostname in {*SERVICES, "127.0.0.1"}, url
            if parsed.scheme.startswith("http") and parsed.path:
                assert client.get(parsed.path).status_code == 200, url


def test_health_checks_and_the_gpu_reservation() -> None:
    assert all("healthcheck" in s for s in SERVICES.values())
    assert {"postgres", "service", "worker-cpu", "worker-gpu"} <= set(SERVICES)
    devices = SERVICES["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] for d in devices)
    assert "--device" in SERVICES["worker-gpu"]["command"]
    assert SERVICES["worker-gpu"]["command"][-1] == "cuda"
    assert SERVICES["worker-cpu"]["command"][-1] == "cpu"


def test_workers_reach_the_service_by_a_name_it_accepts(tmp_path: Path) -> None:
    """The Host check must let the workers' `http://service:8000` in, with the worker token."""
    env = SERVICES["service"]["environment"]
    hosts = re.sub(r"\$\{FXTUNE_ALLOWED_HOSTS:-([^}]*)\}", r"\1", env["FXTUNE_ALLOWED_HOSTS"])
    settings = Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        allowed_hosts=hosts,
        api_token="u",
        worker_token="w",
    )
    for name in ("worker-cpu", "worker-gpu"):
        assert "FXTUNE_WORKER_TOKEN" in SERVICES[name]["environment"]
        assert "FXTUNE_API_TOKEN" not in SERVICES[name]["environment"]
    server = SERVICES["worker-cpu"]["command"][
        SERVICES["worker-cpu"]["command"].index("--server") + 1
    ]
    with TestClient(create_app(settings), base_url=server, client=("172.18.0.3", 1)) as client:
        assert client.get("/healthz").status_code == 200
        body = {"worker_id": "w", "device": "cpu"}
        claim = client.post("/api/v1/jobs/claim", json=body, headers={"Authorization": "Bearer w"})
        assert claim.status_code == 204
    with TestClient(create_app(settings), base_url="http://evil.example:8000") as client:
        assert client.get("/healthz").status_code == 403


def dockerfile_stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined), one list per FROM stage."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    stages: list[list[str]] = []
    for line in (ln.strip() for ln in text.splitlines()):
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            stages.append([])
        stages[-1].append(" ".join(line.split()))
    return stages


def test_the_image_installs_the_built_wheel_and_runs_as_a_user() -> None:
    """Docker is not available to this project's CI: the build's shape is checked here. The
    runtime stage holds what the wheel installs, not the checkout, and does not run as root."""
    build, runtime = dockerfile_stages()[0], dockerfile_stages()[-1]
    name = build[0].split(" AS ")[1]
    assert any(i.startswith("RUN pip wheel") and "--no-deps" in i for i in build)
    assert f"COPY --from={name} /dist/ /tmp/dist/" in runtime
    assert not [i for i in runtime if i.startswith(("COPY . ", "ADD "))]
    installs = [i for i in runtime if i.startswith("RUN ") and "pip install" in i]
    assert not [i for i in installs if " -e " in i or "--editable" in i]
    # The CPU runtimes too (issue 48): workers tune under them, the service checks their files.
    extras = 'fxtune-*.whl)[service,postgres,openvino,onnxruntime]"'
    assert any(extras in i for i in installs), installs
    torch_pin = next(ln for ln in (REPO / "constraints.txt").read_text().splitlines()
                     if ln.startswith("torch=="))  # fmt: skip
    assert any(torch_pin in i for i in installs), torch_pin
    users = [i for i in runtime if i.startswith("USER ")]
    assert users and users[-1] not in ("USER root", "USER 0")
    last_run = max(k for k, i in enumerate(runtime) if i.startswith("RUN "))
    assert runtime.index(users[-1]) > last_run  # nothing after it runs as root
    assert runtime[-1].startswith("CMD ")


def test_compose_references_resolve() -> None:
    """What `docker compose config` would refuse: unknown services in depends_on, undeclared
    volumes, a build context without a Dockerfile, variables the header does not document."""
    declared = set(COMPOSE.get("volumes", {}))
    header = (REPO / "docker-compose.yml").read_text().split("\nname:")[0]
    for name, service in SERVICES.items():
        assert ("image" in service) != ("build" in service), name
        build = service.get("build")
        if build is not None:
            context = build if isinstance(build, str) else build["context"]
            assert (REPO / context / "Dockerfile").is_file(), name
        for dep, cond in service.get("depends_on", {}).items():
            assert dep in SERVICES and dep != name, (name, dep)
            if cond.get("condition") == "service_healthy":
                assert "healthcheck" in SERVICES[dep], (name, dep)
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert source in declared or source.startswith(("/", ".")), (name, volume)
        assert "user" not in service or service["user"] not in ("root", "0"), name
        text = json.dumps(service)
        for var in re.findall(r"\$\{(\w+)", text):
            assert var in header, f"{name} uses ${{{var}}}, which the header does not explain"


@pytest.mark.parametrize(
    "name", [n for n, s in SERVICES.items() if "worker" in s.get("command", [])]
)
def test_workers_run_sandboxed_with_what_bubblewrap_needs(name: str) -> None:
    """No shipped default tunes without a sandbox (round 3: an unsandboxed child read the
    worker's token from /proc): the worker requires bubblewrap, and the container allows it."""
    service = SERVICES[name]
    assert service["environment"]["FXTUNE_WORKER_SANDBOX"] == "bwrap"
    assert {"seccomp=unconfined", "apparmor=unconfined"} <= set(service["security_opt"])
    assert "volumes" not in service  # no data volume, no database URL, no user token
    assert not {"FXTUNE_API_TOKEN", "FXTUNE_DATABASE_URL"} & set(service["environment"])
