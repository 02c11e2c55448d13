"""Errors the tuner raises on purpose, so callers can turn them into clear messages."""


class FxtuneError(Exception):
    """Base class for errors that carry a message meant for the user."""


class ArtifactFormatError(FxtuneError):
    """The file is not a torch.export program archive we can read."""


class UnsafeArtifactError(FxtuneError):
    """The archive would need full pickle (arbitrary code) to load, so it was refused."""


class PassError(FxtuneError):
    """A pass or site name is unknown, or a rewrite could not be applied."""


class LoaderUnavailableError(FxtuneError):
    """This torch lacks what the safe loader needs, so it refuses to load rather than fall back."""


ALLOW_UNCHECKED_TORCH_ENV = "FXTUNE_ALLOW_UNCHECKED_TORCH"


class UncheckedTorchError(FxtuneError):
    """This torch is not one fxtune's private-API uses were checked on (tuner/host/torch_compat.py):
    fxtune refuses rather than guess what those APIs do here (unless ALLOW_UNCHECKED_TORCH_ENV
    is "1")."""


class UnsupportedDeviceError(FxtuneError, ValueError):
    """The device string names no device kind fxtune can tune on, or is malformed.

    Also a ValueError, so argument parsers (typer, pydantic) report it as bad input.
    """


class DeviceUnavailableError(FxtuneError):
    """The device is a supported kind, but this machine (or this torch) does not have it."""


class InputError(FxtuneError, ValueError):
    """What the user gave (sizes, a program without example inputs) cannot be used as given."""


class RankFailedError(FxtuneError):
    """A rank raised, died or overran the job deadline; the other ranks were stopped."""


class NoConfigError(FxtuneError):
    """The service has no tuned config for this model and device (`fxtune fetch`)."""


class CompileError(FxtuneError):
    """A compile in a child process (`tuner.backends.isolation`) did not give a runner: the
    tuner turns it into a candidate's verdict; one that escapes is torch's or this host's
    failure, not the input's."""


class CompileOverrun(CompileError):
    """A compile was stopped because it did not finish in the time it was given."""


class CompileFailed(CompileError):
    """The child compile exited with an error."""


class CompileCrashed(CompileError):
    """The child died by a signal while compiling the package or running it once."""

    def __init__(self, signal_name: str, signal_number: int, what: str = "the package") -> None:
        super().__init__(
            f"crashed: {signal_name} (signal {signal_number}) while compiling {what} or "
            "running it once, in a child process; tuning went on without it"
        )
        self.signal_name = signal_name
