"""Who a request is: the name its quotas are kept under, and the dashboard's session cookie.

A caller is named by a hash of the credential it presented (`token-<32 hex>`), never by the
credential itself: with the one FXTUNE_API_TOKEN of today that is one identity, and several user
tokens later would each get quotas of their own with no change to what is stored. Loopback
clients of a service without a token are one identity of their own, `loopback`.

The session cookie the dashboard's sign-in sets is `v1.<identity>.<expiry>.<mac>`, the MAC an
HMAC-SHA256 under a key derived from the token (the server's secret): it cannot be forged or
extended without the token, nor turned back into it, and a new token ends every session. The
cookie is HttpOnly (no page script reads it), SameSite=Strict (no request another site starts
carries it), Secure on https, and it authorises reads only (`service.api.deps`).
"""

from __future__ import annotations

import hashlib
import hmac

SESSION_COOKIE = "fxtune_session"
LOOPBACK_IDENTITY = "loopback"
_VERSION = "v1"
_KEY_LABEL = b"fxtune dashboard session v1"
MAX_COOKIE_CHARS = 256


def token_identity(token: str) -> str:
    """The quota identity of a bearer token: a hash, so the token is stored nowhere."""
    return "token-" + hashlib.sha256(token.encode()).hexdigest()[:32]


def _mac(token: str, body: str) -> str:
    key = hmac.new(token.encode(), _KEY_LABEL, hashlib.sha256).digest()
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def issue_session(token: str, now: float, lifetime_s: float) -> str:
    """A session cookie value for the holder of `token`, valid for `lifetime_s` from `now`."""
    body = f"{_VERSION}.{token_identity(token)}.{int(now + lifetime_s)}"
    return f"{body}.{_mac(token, body)}"


def session_identity(value: str | None, token: str, now: float) -> str | None:
    """The identity a session cookie names, or None unless it is one `token` signed and it
    has not expired."""
    if not value or len(value) > MAX_COOKIE_CHARS:
        return None
    body, _, mac = value.rpartition(".")
    parts = body.split(".")
    if len(parts) != 3 or parts[0] != _VERSION or not parts[2].isdigit():
        return None
    if not hmac.compare_digest(mac.encode(), _mac(token, body).encode()):
        return None
    if int(parts[2]) <= now:
        return None
    return parts[1]
