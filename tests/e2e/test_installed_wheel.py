"""The installed thing, not the checkout: the wheel built from the sdist, installed into fresh
virtual environments, run from empty folders.

Two environments, as people deploy fxtune: the light one (`pip install fxtune`: the tuner, the
deployment client, the worker) and the full one (`pip install 'fxtune[service,postgres]'`). The
full one serves with an embedded worker and tunes a program submitted with `fxtune submit
--wait`; the light one fetches the config with `load_tuned` and must give the original's
outputs. Neither environment sees the checkout (no PYTHONPATH, cwd an empty folder).

Each environment gets fxtune's wheel and every dependency it declares, resolved and installed by
pip, except torch: it is linked (a .pth file to a folder of links to this interpreter's torch,
the same 2.13.0 wheel constraints.txt pins) because copying 750 MB twice would take most of a
minute; pip sees that torch as installed and checks it against the wheel's requirement.
"""

from __future__ import annotations

import email.parser
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch

from service.launch import free_port
from tests.service.helpers import healthy, tiny_program

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
# What fxtune may put into site-packages: its own packages, its command's module, its metadata.
OWN_TOP_LEVEL = {"tuner", "service", "worker", "fxtune_cli.py", "fxtune-0.1.0.dist-info"}
# Run-time files that are not Python modules and must travel in the wheel.
PACKAGE_DATA = {
    "service/migrations/env.py",
    "service/migrations/script.py.mako",
    "service/migrations/versions/0001_initial.py",
    "service/dashboard/templates/base.html",
    "service/dashboard/templates/index.html",
    "service/dashboard/static/dashboard.js",
    "service/dashboard/static/dashboard.css",
    "service/dashboard/static/vendor/chart.umd.js",
    "service/dashboard/static/vendor/chart.js.LICENSE.md",
}
# What only the service needs: the light install must not have it, and `tuner.deploy.client` must
# not import it anywhere.
SERVICE_ONLY = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "psycopg")
NOT_IN_CLIENT = (*SERVICE_ONLY, "pandas")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that points Python at the checkout or
    configures fxtune (pip's own settings stay: they name this machine's package mirrors)."""
    drop = ("FXTUNE_", "PYTHON", "VIRTUAL_ENV")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **extra}


def run(cmd: list[str], cwd: Path, timeout: float = 300, **env: str) -> str:
    done = subprocess.run(
        cmd, cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@dataclass
class Dists:
    wheel: Path
    sdist: Path


def _copy_ignore(folder: str, names: list[str]) -> set[str]:
    skip = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache", ".ruff_cache"}
    top = {"data", ".hypothesis"} if Path(folder) == REPO else set()
    return {n for n in names if n in skip | top or n.endswith(".egg-info")}


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """The sdist of a copy of the checkout (so no build output lands in it, and none left over
    from an earlier build leaks in), then the wheel built from that sdist, as `python -m build`
    does: what the sdist lacks, the wheel lacks."""
    root = tmp_path_factory.mktemp("dists")
    src = root / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=_copy_ignore)
    out = root / "dist"
    hook = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    name = run([sys.executable, "-c", hook, str(out)], cwd=src).strip().splitlines()[-1]
    sdist = out / name
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    run([*pip, "-w", str(out), str(sdist)], cwd=root)
    (wheel,) = out.glob("fxtune-*.whl")
    return Dists(wheel=wheel, sdist=sdist)


@pytest.mark.slow
def test_the_wheel_holds_fxtune_and_nothing_else(dists: Dists) -> None:
    names = zipfile.ZipFile(dists.wheel).namelist()
    assert {n.split("/")[0] for n in names} == OWN_TOP_LEVEL
    assert set(names) >= PACKAGE_DATA
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".egg-info"))]
    # The sdist carries what a rebuild needs (the wheel above came from it): the migrations as
    # files of service/migrations (the checkout's link resolved), and the license.
    with tarfile.open(dists.sdist) as tf:
        members = {m.name.split("/", 1)[1]: m for m in tf.getmembers() if "/" in m.name}
    assert members["service/migrations/versions/0001_initial.py"].isfile()
    assert not [name for name, m in members.items() if m.issym() or m.islnk()]
    assert "LICENSE" in members


@pytest.mark.slow
def test_the_metadata_would_be_accepted_by_an_index(dists: Dists) -> None:
    """twine's check (README renders as the long description), plus what twine does not look
    at: valid classifiers, a license with its files, project URLs, and the role split."""
    from trove_classifiers import classifiers as known

    out = run([sys.executable, "-m", "twine", "check", "--strict", str(dists.wheel),
               str(dists.sdist)], cwd=dists.wheel.parent)  # fmt: skip
    assert out.count("PASSED") == 2, out
    with zipfile.ZipFile(dists.wheel) as zf:
        meta = email.parser.Parser().parsestr(zf.read("fxtune-0.1.0.dist-info/METADATA").decode())
        assert "fxtune-0.1.0.dist-info/licenses/LICENSE" in zf.namelist()
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta["License-Expression"] and "LICENSE" in meta.get_all("License-File")
    classifiers = meta.get_all("Classifier")
    assert classifiers and set(classifiers) <= known, set(classifiers) - known
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Source", "Issues"} <= set(urls)
    assert all(u.startswith("https://") for u in urls.values())
    requires = meta.get_all("Requires-Dist")
    base = {r.split(">")[0].split("<")[0].split("[")[0] for r in requires if "extra ==" not in r}
    assert base == {"torch", "numpy", "pandas", "pydantic", "pydantic-settings", "httpx", "typer",
                    "rich"}  # fmt: skip
    assert "torch<2.14,>=2.13" in requires
    assert set(meta.get_all("Provides-Extra")) >= {"service", "postgres", "dev"}


@dataclass
class Venvs:
    light: Path
    full: Path


def _torch_links(root: Path) -> Path:
    """A folder of links to this interpreter's torch (its packages and its dist-info)."""
    dist = importlib.metadata.distribution("torch")
    assert dist.version.split("+")[0] == torch.__version__.split("+")[0] == "2.13.0", dist.version
    site = Path(str(dist.locate_file("")))
    links = root / "torch-links"
    links.mkdir()
    tops = (dist.read_text("top_level.txt") or "torch").split()
    for name in [*tops, f"torch-{dist.version}.dist-info"]:
        (links / name).symlink_to(site / name)
    return links


def _venv(path: Path, requirement: str, torch_links: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = next((path / "lib").glob("python3*/site-packages"))
    (site / "_torch_of_the_test_runner.pth").write_text(f"{torch_links}\n")
    pip = [sys.executable, "-m", "pip", "--python", str(path / "bin" / "python"), "-q"]
    run([*pip, "install", "--no-compile", "-c", str(REPO / "constraints.txt"), requirement],
        cwd=path, timeout=600)  # fmt: skip
    run([*pip, "check"], cwd=path)
    return path


@pytest.fixture(scope="module")
def venvs(dists: Dists) -> Iterator[Venvs]:
    """Not under /tmp: the worker's bubblewrap sandbox gives each tuning child a private /tmp,
    where an interpreter installed there would vanish (as it would for a user's venv in /tmp)."""
    root = Path(tempfile.mkdtemp(prefix="fxtune-installed-", dir="/var/tmp"))
    try:
        links = _torch_links(root)
        light = _venv(root / "light", str(dists.wheel), links)
        full = _venv(root / "full", f"{dists.wheel}[service,postgres]", links)
        yield Venvs(light=light, full=full)
    finally:
        shutil.rmtree(root, ignore_errors=True)


CLIENT_IMPORTS = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    import tuner.client
    took = time.perf_counter() - t0
    print(json.dumps({"import_s": took, "modules": sorted({m.split(".")[0] for m in sys.modules}),
                      "file": tuner.deploy.client.__file__}))
    """
)


def client_imports(python: Path, cwd: Path) -> dict:
    return json.loads(run([str(python), "-c", CLIENT_IMPORTS], cwd=cwd).splitlines()[-1])


@pytest.mark.slow
def test_the_light_install_has_no_service_and_says_what_serve_needs(
    venvs: Venvs, tmp_path: Path
) -> None:
    python = venvs.light / "bin" / "python"
    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    assert run([str(python), "-c", probe, *SERVICE_ONLY], cwd=tmp_path).strip() == "[]"
    seen = client_imports(python, tmp_path)
    assert seen["file"].startswith(str(venvs.light)), seen["file"]  # the installed copy
    assert not set(NOT_IN_CLIENT) & set(seen["modules"])
    serve = subprocess.run(
        [str(venvs.light / "bin" / "fxtune"), "serve", "--port", str(free_port())],
        cwd=tmp_path,
        env=clean_env(FXTUNE_DATA_DIR=str(tmp_path / "data")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert serve.returncode == 1, serve
    assert "pip install 'fxtune[service]'" in serve.stderr and "Traceback" not in serve.stderr
    assert "fastapi" in serve.stderr


LOAD_TUNED = textwrap.dedent(
    """
    import json, sys, warnings
    from pathlib import Path
    import torch
    from tuner.deploy.client import FxtuneClientWarning, load_tuned

    model, server, cache = sys.argv[1:4]
    warnings.simplefilter("error", FxtuneClientWarning)  # untuned would be a failure here
    tuned = load_tuned(model, server=server, device="cpu", cache_dir=Path(cache))
    original = torch.export.load(model).module()
    torch.manual_seed(1)
    worst = 0.0
    for batch in range(5):
        x = torch.randn(2, 8)
        want, got = original(x), tuned(x)
        torch.testing.assert_close(got, want)
        worst = max(worst, (got - want).abs().max().item())
    loaded = {m.split(".")[0] for m in sys.modules}
    print(json.dumps({"tuned": type(tuned).__name__, "max_abs_diff": worst,
                      "service_modules": sorted(loaded & set(sys.argv[4:]))}))
    """
)


@pytest.mark.slow
def test_serve_submit_and_load_tuned_from_installed_wheels(
    venvs: Venvs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fxtune serve --embedded-worker` (full install) tunes what `fxtune submit --wait` sent;
    the light install's `load_tuned` and `fxtune fetch` get the config; outputs match."""
    empty = tmp_path / "empty"
    empty.mkdir()
    model = tmp_path / "tiny.pt2"
    tiny_program(model)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    env = clean_env(FXTUNE_DATA_DIR=str(tmp_path / "data"), FXTUNE_WORKER_POLL_S="0.2")
    env["FXTUNE_WORKER_WARM_COMMAND"] = "[]"  # a real build: tests/worker/test_warm_temp.py
    started = time.monotonic()
    with log.open("w") as out:
        serve = subprocess.Popen(
            [str(venvs.full / "bin" / "fxtune"), "serve", "--embedded-worker", "--port", str(port),
             "--log-level", "warning"],
            cwd=empty, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        while not healthy(url):
            assert serve.poll() is None, log.read_text()
            assert time.monotonic() - started < 120, log.read_text()
            time.sleep(0.25)
        page = httpx.get(f"{url}/")  # templates, from the installed package
        assert page.status_code == 200 and "<html" in page.text.lower(), page.text[:500]
        chart = httpx.get(f"{url}/static/vendor/chart.umd.js")
        assert chart.status_code == 200 and len(chart.content) > 100_000
        submit = [str(venvs.full / "bin" / "fxtune"), "submit", str(model), "--server", url,
                  "--device", "cpu", "--budget-s", "3", "--wait"]  # fmt: skip
        submitted = run(submit, cwd=empty, timeout=300, COLUMNS="100")
        assert "tuned: backend" in submitted, submitted
        fetched = run([str(venvs.light / "bin" / "fxtune"), "fetch", str(model), "--server", url,
                       "--device", "cpu"], cwd=empty)  # fmt: skip
        config = json.loads(fetched)
        light = venvs.light / "bin" / "python"
        args = [str(model), url, str(tmp_path / "cache"), *NOT_IN_CLIENT]
        result = json.loads(run([str(light), "-c", LOAD_TUNED, *args], cwd=empty).splitlines()[-1])
    finally:
        serve.terminate()
        serve.wait(30)
    assert result["service_modules"] == [], result
    assert not [line for line in log.read_text().splitlines() if "Traceback" in line]
    with capsys.disabled():
        print(f"\n--- installed-wheel smoke run ({time.monotonic() - started:.0f} s) ---")
        print(f"$ fxtune submit tiny.pt2 --wait  (full install, in {empty})\n{submitted.strip()}")
        print(f"$ fxtune fetch tiny.pt2  (light install): backend {config.get('backend')}, "
              f"fingerprint {config['model_fingerprint'][:16]}")  # fmt: skip
        print(f"load_tuned (light install): {json.dumps(result)}")
