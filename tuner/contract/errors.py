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


class UncheckedTorchError(FxtuneError):
    """This torch is not one fxtune's private-API uses were checked on (tuner/host/torch_compat.py):
    fxtune refuses rather than guess what those APIs do here."""


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
