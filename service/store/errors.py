"""Store errors; the API maps each to one HTTP status."""


class StoreError(Exception):
    """Base class; the message is meant for the client."""


class NotFound(StoreError):
    """No such model, job or config (404)."""


class StaleLease(StoreError):
    """The lease token is not the job's current one: a newer attempt owns it (409)."""


class OverQuota(StoreError):
    """A caller's quota would be exceeded (429); `kind` names which, `retry_after_s` when it
    may pass (None: the API's default for the kind)."""

    def __init__(self, detail: str, kind: str, retry_after_s: int | None = None) -> None:
        super().__init__(detail)
        self.kind = kind
        self.retry_after_s = retry_after_s
