"""Uploaded and tuned programs are untrusted bytes: they are opened only through the tuner's
safe loader (`tuner.load.load_program`), never with plain `torch.export.load`."""

from __future__ import annotations

from pathlib import Path

from tuner.bounds import load_bounded
from tuner.errors import LoaderUnavailableError
from tuner.fingerprint import model_fingerprint
from tuner.load import load_program


class UnloadableProgram(ValueError):
    """The archive is not a program the safe loader accepts (the message says why)."""


def _load(path: Path, what: str, bounded: bool = False) -> object:
    try:
        return load_bounded(path) if bounded else load_program(path)
    except LoaderUnavailableError:
        raise  # this server's torch, not the file, is at fault
    except Exception as exc:  # untrusted bytes: any failure is the file's fault, not ours
        raise UnloadableProgram(f"{what} cannot be loaded safely: {exc}") from None


def fingerprint_of(path: Path, what: str = "the uploaded program") -> str:
    """`model_fingerprint` of a stored or uploaded `.pt2` (slow: call it in a thread)."""
    program = _load(path, what, bounded=True)  # an upload: refuse resource bombs too
    try:
        return model_fingerprint(program)  # type: ignore[arg-type]
    except Exception as exc:
        raise UnloadableProgram(f"{what} cannot be traced: {exc}") from None


def check_loadable(path: Path, what: str = "the tuned program") -> None:
    _load(path, what)
