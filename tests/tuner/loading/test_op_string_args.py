"""Operators' string arguments never reach a code generator as the upload wrote them.

Inductor's C++ kernel generator pastes `aten._assert_async.msg`'s message into
`throw std::runtime_error("{msg}")` unescaped: the control shows a message holding C++ runs it
under plain torch (`torch.export.load` and `torch.compile`). Then every string argument of a
program that uses twelve string-taking operators gets each payload that can leave a literal or a
comment (`"`, `\\`, a newline, `*/`): fxtune's loader refuses it, or replaces it (free text)
with a fixed one. The program that survives is compiled through torch.compile and AOTInductor
with the payloads in every replaced slot: no marker, the outputs those of the original.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.crafted import (
    Strings,
    assert_message,
    cpp_payload,
    rewrite,
    strings_inputs,
    strings_program_file,
)
from tuner.contract.errors import UnsafeArtifactError
from tuner.contract.op_strings import Replaced, rule_for
from tuner.loading.load import load_program

PAYLOADS = {
    "quote": 'sum"); system("x',
    "backslash": "sum\\",
    "newline": "sum\nint x;",
    "comment": "sum */ int x; /*",
}


def _program_json(path: Path) -> dict[str, Any]:
    with zipfile.ZipFile(path) as zf:
        member = next(n for n in zf.namelist() if n.endswith("models/model.json"))
        return json.loads(zf.read(member))


def _string_slots(program: dict[str, Any]) -> list[tuple[int, int, str, str]]:
    """(node index, input index, operator, argument) of every string argument."""
    slots = []
    for i, node in enumerate(program["graph_module"]["graph"]["nodes"]):
        for j, named in enumerate(node["inputs"]):
            if "as_string" in named["arg"]:
                slots.append((i, j, node["target"], named["name"]))
    return slots


def _with_strings(src: Path, dst: Path, values: dict[tuple[int, int], str]) -> Path:
    def edit(name: str, data: bytes) -> bytes:
        if not name.endswith("models/model.json"):
            return data
        program = json.loads(data)
        nodes = program["graph_module"]["graph"]["nodes"]
        for (i, j), value in values.items():
            nodes[i]["inputs"][j]["arg"]["as_string"] = value
        return json.dumps(program).encode()

    return rewrite(src, dst, edit)


@pytest.fixture(scope="module")
def strings_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("strings")
    return strings_program_file(root / "strings.pt2")


def test_the_program_carries_twelve_string_arguments(strings_program: Path) -> None:
    slots = _string_slots(_program_json(strings_program))
    assert len(slots) == 12, slots
    assert all(rule_for(target, arg) is not None for _, _, target, arg in slots)
    loaded = load_program(strings_program)  # the exporter's own values all pass
    assert torch.allclose(loaded.module()(*strings_inputs()), Strings()(*strings_inputs()))


def test_every_payload_in_every_string_argument_is_refused_or_replaced(
    strings_program: Path, tmp_path: Path
) -> None:
    slots = _string_slots(_program_json(strings_program))
    outcomes = {"refused": 0, "replaced": 0}
    for i, j, target, arg in slots:
        for kind, payload in PAYLOADS.items():
            mutant = _with_strings(strings_program, tmp_path / f"{i}-{kind}.pt2", {(i, j): payload})
            try:
                program = load_program(mutant)
            except UnsafeArtifactError as exc:
                assert arg in str(exc) and target in str(exc), str(exc)
                outcomes["refused"] += 1
                continue
            assert isinstance(rule_for(target, arg), Replaced), (target, arg, kind)
            kept = [a for n in program.graph.nodes for a in (*n.args, *n.kwargs.values())]
            assert payload not in kept and not any(isinstance(a, str) and "*/" in a for a in kept)
            outcomes["replaced"] += 1
    # Free text (3 messages) keeps only the comment payload, as a fixed text; the rest refused.
    assert outcomes == {"refused": 12 * 4 - 3, "replaced": 3}, outcomes


COMPILE = textwrap.dedent(
    """
    import os, pathlib, sys, torch
    from tuner.loading.load import load_program
    from tuner.backends.registry import load_aoti, package_aoti
    path, loader, marker, folder = sys.argv[1:5]
    program = torch.export.load(path) if loader == "torch" else load_program(path)
    inputs = torch.load(os.path.join(folder, "inputs.pt"))
    expected = torch.load(os.path.join(folder, "expected.pt"))
    runs = {"compile": torch.compile(program.module())}
    if loader == "fxtune":
        runs["aoti"] = load_aoti(package_aoti(program, pathlib.Path(folder) / "p.pt2"))
    for how, run in runs.items():
        out = run(*inputs)
        out = out[0] if isinstance(out, (list, tuple)) else out
        assert torch.allclose(out, expected, atol=1e-5), (how, (out - expected).abs().max())
        print(how, os.path.exists(marker))
    """
)


def _compile(path: Path, loader: str, marker: Path, folder: Path) -> dict[str, bool]:
    """Load `path` in a child with `loader` (torch's or fxtune's), compile it with torch.compile
    (and, loaded by fxtune, AOTInductor), run it: whether the marker was there after each."""
    cmd = [sys.executable, "-c", COMPILE, str(path), loader, str(marker), str(folder)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {how: ran == "True" for how, ran in (ln.split() for ln in done.stdout.splitlines())}


@pytest.mark.slow
def test_the_assert_message_runs_cpp_under_plain_torch_and_is_refused_by_fxtune(
    tmp_path: Path,
) -> None:
    """The control for the C++ route, then fxtune's refusal of the very same file."""
    marker = tmp_path / "marker"
    exploit = assert_message(tmp_path / "exploit.pt2", cpp_payload(marker))
    x = torch.randn(4, 4)
    torch.save((x,), tmp_path / "inputs.pt")
    torch.save(x * 2, tmp_path / "expected.pt")
    assert _compile(exploit, "torch", marker, tmp_path) == {"compile": True}, "no control"
    marker.unlink()
    with pytest.raises(UnsafeArtifactError, match="assert_msg"):
        load_program(exploit)


@pytest.mark.slow
def test_what_survives_compiles_without_running_a_payload(
    strings_program: Path, tmp_path: Path
) -> None:
    slots = _string_slots(_program_json(strings_program))
    replaced = {
        (i, j): f"{PAYLOADS['comment']} {cpp_payload(tmp_path / 'marker')}".replace('"', "'")
        for i, j, target, arg in slots
        if isinstance(rule_for(target, arg), Replaced)
    }
    assert len(replaced) == 3
    survivor = _with_strings(strings_program, tmp_path / "survivor.pt2", replaced)
    torch.save(strings_inputs(), tmp_path / "inputs.pt")
    torch.save(Strings()(*strings_inputs()), tmp_path / "expected.pt")
    ran = _compile(survivor, "fxtune", tmp_path / "marker", tmp_path)
    assert ran == {"compile": False, "aoti": False}
