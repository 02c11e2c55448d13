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
