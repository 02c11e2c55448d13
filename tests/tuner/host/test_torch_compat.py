"""tuner/host/torch_compat.py: the registry of private torch APIs is complete and true on this
torch, and another torch is refused clearly at first use (never at import), unless overridden.

On a new torch, this file is the check to run (with FXTUNE_ALLOW_UNCHECKED_TORCH=1) before
adding its series to CHECKED_SERIES.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest
import torch

from tuner.contract.errors import UncheckedTorchError
from tuner.contract.exit_codes import ExitCode, exit_code_for
from tuner.host import torch_compat
from tuner.host.torch_compat import ALLOW_ENV, CHECKED_SERIES, PRIVATE_APIS, check_torch

REPO = Path(__file__).resolve().parents[3]
TUNER = REPO / "tuner"
# Files owned by work in progress that still import private torch directly; they are listed
# in the registry's used_by all the same (checked below). Converting them is a small follow-up.
# The loader imports export's deserializer lazily, inside its version-checked helpers.
DIRECT_IMPORTS_ALLOWED = {"loading/load.py", "host/torch_compat.py"}


def test_a_torch_outside_the_checked_set_is_refused_with_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with pytest.raises(UncheckedTorchError) as refused:
        check_torch("2.99.0+cu999")
    message = str(refused.value)
    assert "fxtune was checked on torch 2.13; this is torch 2.99.0+cu999" in message
    assert ALLOW_ENV in message and "torch_compat.py" in message
    assert exit_code_for(refused.value) == ExitCode.INTERNAL  # another worker may be checked
    for older in ("2.12.1", "2.11.0", "1.13.1", "3.13.0"):
        with pytest.raises(UncheckedTorchError):
            check_torch(older)


@pytest.mark.parametrize("version", ["2.13.0", "2.13.0+cpu", "2.13.1", "2.13.0a0+git1234abc"])
def test_builds_of_a_checked_series_pass(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    check_torch(version)


def test_the_expert_override_lets_another_torch_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOW_ENV, "1")
    check_torch("2.99.0")
    monkeypatch.setenv(ALLOW_ENV, "yes")  # only "1": a typo must not silently disable the check
    with pytest.raises(UncheckedTorchError):
        check_torch("2.99.0")


def test_this_torch_is_checked_and_the_package_says_so() -> None:
    assert torch_compat.series(torch.__version__) in CHECKED_SERIES
    assert all("2.13.0" in api.checked_on for api in PRIVATE_APIS)


def test_only_registered_modules_and_names_go_through_the_helpers() -> None:
    with pytest.raises(KeyError, match="not registered"):
        torch_compat.private("torch._dynamo")
    with pytest.raises(AttributeError, match="not registered"):
        _ = torch_compat.pytree.tree_map_only  # a new name must be added to the registry


@pytest.mark.parametrize("api", [a for a in PRIVATE_APIS if a.kind == "module"], ids=str)
def test_every_registered_module_has_its_names_on_this_torch(api: torch_compat.PrivateApi) -> None:
    module = importlib.import_module(api.name)
    assert [n for n in api.names if not hasattr(module, n)] == []


def test_registered_attributes_and_ops_exist_on_this_torch() -> None:
    schema = torch.ops.aten.add.Tensor._schema
    assert schema.arguments and schema.returns
    gm = torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),)).module()
    assert hasattr(gm.graph._codegen, "pytree_info")
    for api in PRIVATE_APIS:
        if api.kind == "op":
            namespace = getattr(torch.ops, api.name.removeprefix("torch.ops."))
            for name in api.names:
                assert hasattr(namespace, name), f"{api.name}.{name}"
    kinds = {a.name for a in PRIVATE_APIS if a.kind != "module"}
    assert kinds == {"OpOverload._schema", "Graph._codegen", "torch.ops._c10d_functional",
                     "torch.ops.aten"}  # fmt: skip


def _code(path: Path) -> str:
    """The file without comments, strings and `if TYPE_CHECKING:` blocks: only what runs."""
    lines = path.read_text().splitlines(keepends=True)
    for node in ast.walk(ast.parse("".join(lines))):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for i in range(node.body[0].lineno - 1, node.body[-1].end_lineno or 0):
                lines[i] = "\n"
    tokens = tokenize.generate_tokens(io.StringIO("".join(lines)).readline)
    kept = [t.string for t in tokens if t.type not in (tokenize.COMMENT, tokenize.STRING)]
    return " ".join(kept)


PRIVATE_MODULE = re.compile(r"^torch(\.\w+)*\.(_(?!_)\w+|fx\.experimental|fx\.passes)(\.\w+)*$")


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent is a module, not a package
        return False


def private_uses(path: Path) -> set[str]:
    """Private torch modules a file imports or reaches (a private name of a public module
    counts as a use of that module)."""
    code = _code(path)
    uses: set[str] = set()
    for module, names in re.findall(r"from (torch[\w. ]*?) import \(?([\w ,]+)", code):
        module = module.replace(" ", "")
        for name in (n.split(" as ")[0].strip() for n in names.split(",")):
            if name.startswith("_") and not name.startswith("__"):
                uses.add(f"{module}.{name}" if _is_module(f"{module}.{name}") else module)
            elif PRIVATE_MODULE.match(module):
                uses.add(module)
    for chain in re.findall(r"\btorch(?: \. \w+)+", code):
        parts = chain.replace(" ", "").split(".")
        first = next(
            (i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")), None
        )
        if first is not None:
            uses.add(".".join(parts[: first + 1]))
        elif PRIVATE_MODULE.match(".".join(parts)):
            uses.add(".".join(parts))
    return uses


def test_the_scanner_sees_each_form_of_private_use(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from torch._inductor import config\n"
        "from torch.utils import _pytree as pytree\n"
        "from torch.fx.graph import _PyTreeCodeGen\n"
        "from torch.fx.experimental.symbolic_shapes import (\n    DimDynamic,\n)\n"
        "x = torch.utils._pytree.tree_leaves(y)\n"
        "# torch._dynamo in a comment is not a use\n"
        "s = 'torch._guards in a string is not a use'\n"
        "if TYPE_CHECKING:\n    from torch._dynamo import eval_frame  # typing only\n"
    )
    assert private_uses(sample) == {
        "torch._inductor",
        "torch.utils._pytree",
        "torch.fx.graph",
        "torch.fx.experimental.symbolic_shapes",
    }


def _registered(use: str) -> torch_compat.PrivateApi | None:
    for api in PRIVATE_APIS:
        if use == api.name or use.startswith(api.name + ".") or api.name.startswith(use + "."):
            return api
    return None


@pytest.mark.parametrize(
    "path", sorted(TUNER.rglob("*.py")), ids=lambda p: str(p.relative_to(TUNER))
)
def test_every_private_use_in_the_tuner_is_registered_and_goes_through_a_helper(
    path: Path,
) -> None:
    rel = str(path.relative_to(TUNER))
    uses = private_uses(path)
    if rel == "host/torch_compat.py":
        return
    for use in uses:
        if use.startswith("torch.ops."):
            continue  # op namespaces: registered as kind "op", checked above
        api = _registered(use)
        assert api is not None, f"{rel} uses {use}: register it in tuner/host/torch_compat.py"
        assert rel in api.used_by, f"{rel} uses {use}: add it to that entry's used_by"
        assert rel in DIRECT_IMPORTS_ALLOWED, f"{rel} imports {use}: go through torch_compat"


def test_used_by_names_real_users() -> None:
    """No stale entries: each listed file still mentions the API (or its helper)."""
    for api in PRIVATE_APIS:
        leaf = api.name.split(".")[-1]
        for rel in api.used_by:
            text = (TUNER / rel).read_text()
            helper = any(n in text for n in api.names) or leaf.lstrip("_") in text
            assert helper, f"{rel} no longer uses {api.name}"


def _run_python(code: str, *first: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter without the override: `first` on its path, then the
    checkout, then what was there (a GPU host's wheels come on PYTHONPATH)."""
    full_env = {k: v for k, v in os.environ.items() if k != ALLOW_ENV}
    path = [*map(str, first), str(REPO), os.environ.get("PYTHONPATH", "")]
    full_env.update(PYTHONPATH=os.pathsep.join(p for p in path if p), **env)
    return subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=300
    )


def _with_torch_version(version: str, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter whose torch reports `version`."""
    return _run_python(f"import torch; torch.__version__ = {version!r}\n" + code, **env)


def test_another_torch_fails_at_first_use_not_at_import(tmp_path: Path) -> None:
    """Importing the client (a deployment's start-up) works; load_tuned runs a program untuned
    with one warning that says why, and refuses a .pt2 path (the safe loader stands on private
    torch: no model to fall back to); `fxtune sites` stops with the message and exit 1."""
    model = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),)), model)
    code = f"""
import sys, warnings
from pathlib import Path
import tuner.deploy.client, tuner.tuning.tuner, fxtune_cli  # no refusal at import
from tuner.deploy.client import load_tuned
from tuner.contract.errors import UncheckedTorchError
program = torch.export.load({str(model)!r})
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    module = load_tuned(program, server="http://127.0.0.1:9", cache_dir=Path({str(tmp_path)!r}))
print("warnings:", [str(w.message) for w in caught])
try:
    load_tuned({str(model)!r}, server="http://127.0.0.1:9", cache_dir=Path({str(tmp_path)!r}))
except UncheckedTorchError:
    print("path refused")
sys.argv = ["fxtune", "sites", {str(model)!r}]
fxtune_cli.main()
"""
    done = _with_torch_version("2.99.0", code)
    untuned = "fxtune: running the model untuned: fxtune was checked on torch 2.13; this is "
    stderr = " ".join(done.stderr.split())  # the message as printed, whatever its wrapping
    assert f"warnings: [{untuned}torch 2.99.0" in done.stdout.replace('"', ""), done
    assert "path refused" in done.stdout, done
    assert done.returncode == ExitCode.INTERNAL, done
    assert "error: fxtune was checked on torch 2.13; this is torch 2.99.0" in stderr, stderr
    assert "Traceback" not in stderr
    allowed = _with_torch_version("2.99.0", code, **{ALLOW_ENV: "1"})
    assert allowed.returncode == 0, allowed  # the override: the sites are listed
    assert "checked on torch" not in allowed.stdout + allowed.stderr


# Any Python started with this folder on its path that imports torch sees `VERSION`: the
# worker's device probe is a child of the worker, where an in-process assignment cannot reach.
SITECUSTOMIZE = """
import importlib.util, sys

class _Reported:
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.__version__ = VERSION

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Reported())
"""


def test_the_worker_refuses_to_start_on_another_torch_without_importing_it(
    tmp_path: Path,
) -> None:
    """The refusal comes from the worker's device probe (a child that imports torch anyway);
    the worker itself never imports torch."""
    (tmp_path / "sitecustomize.py").write_text("VERSION = '2.14.0'\n" + SITECUSTOMIZE)
    code = (
        "import sys; from fxtune_cli import main\n"
        "sys.argv = ['fxtune', 'worker', '--device', 'cpu', '--server', 'http://127.0.0.1:9']\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    print('torch imported:', 'torch' in sys.modules)\n"
    )
    done = _run_python(code, tmp_path)
    assert done.returncode == ExitCode.INTERNAL, done
    stderr = " ".join(done.stderr.split())
    assert "error: fxtune was checked on torch 2.13; this is torch 2.14.0" in stderr, stderr
    assert "torch imported: False" in done.stdout, done


def test_the_override_reaches_the_children(tmp_path: Path) -> None:
    """Tuning, compiling and checking run in children with an allowlisted environment: an
    override the operator set for `fxtune tune` must hold there too, or the first compile child
    refuses the torch its parent accepted."""
    from tuner.host.child_env import child_environment

    env = child_environment(tmp_path, parent={ALLOW_ENV: "1", "FXTUNE_DATA_DIR": "/x"})
    assert env[ALLOW_ENV] == "1" and "FXTUNE_DATA_DIR" not in env
    assert ALLOW_ENV not in child_environment(tmp_path, parent={})
