"""What `fxtune` exits with, per error type: the worker decides from it whether to retry a job.

Only errors the tuner raises on purpose get a code other than INTERNAL. A plain ValueError or
TypeError from inside the tuner is a bug, and a bug may be fixed by the next attempt (or by
another worker's fxtune), so it must never look like the user's fault.
"""

from __future__ import annotations

from enum import IntEnum

from tuner.contract.errors import (
    CompileError,
    DeviceUnavailableError,
    FxtuneError,
    LoaderUnavailableError,
    RankFailedError,
    UncheckedTorchError,
    UnsafeArtifactError,
)


class ExitCode(IntEnum):
    OK = 0
    INTERNAL = 1  # a bug or the environment (torch lacks the safe loader): retryable
    USER_INPUT = 2  # a bad model, option or size: retrying cannot help
    REFUSED = 3  # an artifact refused as unsafe (it would need full pickle)
    DEVICE = 4  # the device is missing or cannot be timed on this machine


# Looked up along the error's MRO, so the most specific registered class wins.
EXIT_CODES: dict[type[BaseException], ExitCode] = {
    UnsafeArtifactError: ExitCode.REFUSED,
    DeviceUnavailableError: ExitCode.DEVICE,
    LoaderUnavailableError: ExitCode.INTERNAL,  # this torch's fault, not the user's
    RankFailedError: ExitCode.INTERNAL,  # a rank died: any cause, retry may succeed
    UncheckedTorchError: ExitCode.INTERNAL,  # this host's torch: another worker's may be checked
    CompileError: ExitCode.INTERNAL,  # torch's or this host's compile, not the input
    FxtuneError: ExitCode.USER_INPUT,
}


def exit_code_for(exc: BaseException) -> ExitCode:
    for cls in type(exc).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    return ExitCode.INTERNAL
