"""Who may see the dashboard, and its sign-in.

A browser cannot put a bearer header on a page navigation, so with FXTUNE_API_TOKEN set the
dashboard signs in: the form of /login POSTs the token to the server, which answers with a
session cookie (`service.api.identity`: a value signed with a key derived from the token, never
the token), HttpOnly, SameSite=Strict and Secure on https. No page script holds the token or the
cookie. The cookie authorises reads only (pages, and the API's GETs the pages' scripts make);
the forms that write take the token from the user for that one request and send it in the
`Authorization` header, which no other site can make a browser send. POST /logout clears it.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from fastapi import HTTPException, Request

from service.api.deps import Credentials, SettingsDep, check_reader

MAX_FORM_BYTES = 8192
MAX_NEXT_CHARS = 2000


class LoginRequired(Exception):
    """A dashboard page was refused; the app answers with the login page instead of JSON."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail


def require_page_reader(request: Request, settings: SettingsDep, creds: Credentials) -> str:
    """The reader's identity, as the API's read rule gives it (session cookie included)."""
    try:
        return check_reader(request, settings, creds)
    except HTTPException as exc:
        raise LoginRequired(exc.status_code, str(exc.detail)) from None


def local_path(target: str | None) -> str:
    """Where to go after signing in: a path of this service, never another site's URL."""
    if not target or len(target) > MAX_NEXT_CHARS or not target.startswith("/"):
        return "/"
    if target.startswith("//") or "\\" in target or not target.isprintable():
        return "/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return "/"
    return target


async def login_form(request: Request) -> tuple[str, str]:
    """(token, next) from the sign-in form's urlencoded body."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return "", "/"
    try:
        fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
    except ValueError:  # more fields than the form has
        return "", "/"
    token = (fields.get("token") or [""])[0]
    return token.strip(), local_path((fields.get("next") or ["/"])[0])
