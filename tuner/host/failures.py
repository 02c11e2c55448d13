"""Fallbacks that say why: each exception the tuner turns into a verdict or a skip, kept and logged.

fxtune never ships something worse or wrong: when a pass, a backend build, a compile or a site
measurement fails, that candidate or site is dropped and the original stands. But a broad
`except` that turns *any* exception into "failed to run" turns fxtune's own bugs into verdicts
too. So every such place calls `fallback(exc, where, expected)`, which

- logs the exception and keeps it in the run's `FailureLog` (type, message, a bounded traceback,
  where, and whether it was expected there): `tune_program` writes that log to the config as
  `tuning["errors"]`;
- in strict mode (FXTUNE_STRICT=1, read once: `settings()`) re-raises an exception that is not
  expected at that place, instead of letting it become a verdict. The test suite runs strict.

What is expected, by place (the `expected` argument):

- `from_torch` (the default), wherever fxtune hands torch something to build, lower or run that
  it merely tried: building a candidate under a backend and its compiling first call
  (`Tuner._judge`), checking a candidate (`_judge_at`), a candidate's run inside an output or
  step check (`check_outputs`, `ReferenceSteps.check`, `check_site_step`), measuring a site
  (`SiteSearch._measure`), applying every pass for the "every pass" candidates, the size buckets
  and their dispatching program, running the original at another size (`size_points`), counting
  ops under a dispatch mode (profiles). Expected there: fxtune's own errors (`FxtuneError`: a
  compile overrun, crash or failure in its child, a refused rewrite) and what torch raises: its
  exception classes (lowering, dynamo, export errors), a `RuntimeError` or `NotImplementedError`
  (torch's C++ errors surface as these, whichever frame called the op), and anything raised
  inside torch's own code (or sympy, triton, the program's generated code). Not expected: an
  `AttributeError`, `TypeError`, `KeyError`... raised by fxtune's own code (a pass's rewrite,
  the site extraction, packing a candidate's inputs) or by any other code outside torch: a bug.
- `anything`, where the fallback loses only a refinement, never a verdict: the float64 copy of
  the user's model that tightens an output check (a model may not run in float64 at all).

The loader is stricter still (`tuner.loading`, `input_fault`): an exception is blamed on the
upload (a "bad upload", exit 2, which the worker never retries) only when `from_torch` expects
it: torch's deserializer or its ops failing on the upload's data. Anything else is raised, strict
or not, and exits 1.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import asdict, dataclass

from tuner.contract.errors import FxtuneError

log = logging.getLogger("fxtune.failures")

STRICT_ENV = "FXTUNE_STRICT"
MAX_TRACEBACK_CHARS = 4000
MAX_FRAMES = 12  # the innermost ones: where it went wrong
MAX_RECORDS = 50  # per run; identical failures are counted, not repeated
# Code that is torch's, for `from_torch`: its packages and what it generates or drives.
TORCH_PACKAGES = ("torch", "functorch", "torchgen", "triton", "sympy", "mpmath", "torch_xla")
# The CPU runtimes fxtune hands a graph to (`tuner.backends.runtimes`), counted as torch's: what
# they raise on a graph is theirs, as a lowering error is inductor's.
RUNTIME_PACKAGES = ("openvino", "onnxruntime", "onnx", "onnxscript", "onnx_ir")
GENERATED_CODE = ("<eval_with_key>", "torchinductor_")  # FX's generated forward, inductor's cache

Expected = Callable[[BaseException], bool]


@dataclass(frozen=True)
class FailureSettings:
    """How fallbacks behave in this process; `strict` re-raises unexpected exceptions."""

    strict: bool = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> FailureSettings:
        value = environ.get(STRICT_ENV, "").strip().lower()
        return cls(strict=value in ("1", "true", "yes", "on"))


@functools.cache
def settings() -> FailureSettings:
    """Read from the environment once, on first use (a test opts out by patching this)."""
    return FailureSettings.from_environ(os.environ)


def ours(exc: BaseException) -> bool:
    """An error fxtune raises on purpose (`tuner.contract.errors`)."""
    return isinstance(exc, FxtuneError)


def from_torch(exc: BaseException) -> bool:
    """fxtune's own error, or a failure raised by torch (see the module docstring)."""
    if ours(exc) or isinstance(exc, MemoryError):
        return True
    if isinstance(exc, RuntimeError) and not isinstance(exc, RecursionError):
        return True  # NotImplementedError and torch.OutOfMemoryError included
    if type(exc).__module__.partition(".")[0] in TORCH_PACKAGES + RUNTIME_PACKAGES:
        return True
    return _is_torch_code(_raised_in(exc))


def anything(exc: BaseException) -> bool:
    return True


def _raised_in(exc: BaseException) -> str:
    """The file of the innermost frame: where the exception was raised."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename


@functools.cache
def _torch_roots() -> tuple[str, ...]:
    roots: list[str] = []
    for name in TORCH_PACKAGES + RUNTIME_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)  # a top-level name: nothing is imported
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec else []:
            roots.append(os.path.realpath(folder) + os.sep)
    return tuple(roots)


def _is_torch_code(filename: str) -> bool:
    if any(mark in filename for mark in GENERATED_CODE):
        return True
    return bool(filename) and os.path.realpath(filename).startswith(_torch_roots())


@dataclass
class Failure:
    """One exception that became a verdict or a skip, as the report keeps it."""

    where: str
    type: str
    message: str
    expected: bool
    traceback: str
    count: int = 1

    @property
    def reason(self) -> str:
        """What a verdict's reason says: the type and the message."""
        return f"{self.type}: {self.message}"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class FailureLog:
    """The failures of one run, in order; at most MAX_RECORDS distinct ones."""

    def __init__(self) -> None:
        self.failures: list[Failure] = []
        self.dropped = 0

    def add(self, failure: Failure) -> None:
        for known in self.failures:
            if (known.where, known.type, known.message) == (
                failure.where,
                failure.type,
                failure.message,
            ):
                known.count += 1
                return
        if len(self.failures) >= MAX_RECORDS:
            self.dropped += 1
            return
        self.failures.append(failure)

    def to_list(self) -> list[dict[str, object]]:
        out = [f.to_dict() for f in self.failures]
        if self.dropped:
            out.append({"where": "(more)", "dropped": self.dropped})
        return out


_CURRENT: ContextVar[FailureLog | None] = ContextVar("fxtune_failure_log", default=None)


@contextlib.contextmanager
def recording() -> Iterator[FailureLog]:
    """Keep the fallbacks of what runs inside (in this thread) in a fresh log."""
    failure_log = FailureLog()
    token = _CURRENT.set(failure_log)
    try:
        yield failure_log
    finally:
        _CURRENT.reset(token)


def bounded_traceback(exc: BaseException) -> str:
    """The innermost MAX_FRAMES frames and the message, cut to MAX_TRACEBACK_CHARS from the end."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-MAX_FRAMES)
    text = "".join(lines)
    if len(text) > MAX_TRACEBACK_CHARS:
        text = "..." + text[-(MAX_TRACEBACK_CHARS - 3) :]
    return text


def describe(exc: BaseException, where: str, expected: bool) -> Failure:
    message = str(exc)
    return Failure(where, type(exc).__name__, message, expected, bounded_traceback(exc))


def fallback(exc: BaseException, where: str, expected: Expected = from_torch) -> Failure:
    """Record `exc`, which the caller is about to turn into a verdict or a skip at `where`.

    Call it from the `except` block. In strict mode an exception `expected` does not accept is
    re-raised (with its own traceback) and nothing is recorded.
    """
    is_expected = expected(exc)
    if settings().strict and not is_expected:
        raise exc
    failure = describe(exc, where, is_expected)
    if is_expected:
        log.info("%s: fell back after %s", where, failure.reason)
    else:
        log.warning("%s: fell back after an unexpected %s", where, failure.reason, exc_info=exc)
    current = _CURRENT.get()
    if current is not None:
        current.add(failure)
    return failure


def input_fault(exc: BaseException, where: str, expected: Expected = from_torch) -> Failure:
    """Record `exc`, which the caller is about to blame on its input (a bad or refused upload).

    An exception `expected` does not accept is re-raised, strict or not: fxtune's own bug
    reported as a bad upload would exit 2, and the worker never retries that.
    """
    if not expected(exc):
        raise exc
    failure = describe(exc, where, True)
    log.info("%s: the input is at fault: %s", where, failure.reason)
    current = _CURRENT.get()
    if current is not None:
        current.add(failure)
    return failure
