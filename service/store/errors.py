"""Store errors; the API maps each to one HTTP status."""


class StoreError(Exception):
    """Base class; the message is meant for the client."""


class NotFound(StoreError):
    """No such model, job or config (404)."""


class StaleLease(StoreError):
    """The lease token is not the job's current one: a newer attempt owns it (409)."""
