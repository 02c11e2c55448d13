"""Model files users hand fxtune that are not torch.export programs, made as users make them:
`torch.save` of a module, `torch.jit.save` of a traced one, a text file, and a real program
whose JSON says another torch wrote it. Shared by the loader's, the CLI's and the API's tests."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tuner.loading import diagnose


def _module() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())


def torch_saved(folder: Path) -> Path:
    path = folder / "module.pt"
    torch.save(_module(), path)
    return path


def torchscript(folder: Path) -> Path:
    path = folder / "scripted.pt"
    torch.jit.save(torch.jit.trace(_module(), torch.randn(2, 4)), path)
    return path


def text(folder: Path) -> Path:
    path = folder / "model.pt2"
    path.write_text("torch.export.save(ep, 'model.pt2')\n")
    return path


# (what, how to make it, the message it must get)
WRONG_FILES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("text file", text, diagnose.TEXT),
    ("torch.save of a module", torch_saved, diagnose.TORCH_SAVE),
    ("TorchScript file", torchscript, diagnose.TORCHSCRIPT),
]


def with_program_json(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """`src` (a real .pt2) with its program JSON edited."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("/models/model.json"):
                program = json.loads(data)
                edit(program)
                data = json.dumps(program).encode()
            zout.writestr(info, data)
    return dst


def exported_by_old_torch(program: dict[str, Any]) -> None:
    """As torch 2.3 wrote it: another major version of export's schema."""
    program["torch_version"] = "2.3.1"
    program["schema_version"] = {"major": 7, "minor": 3}
