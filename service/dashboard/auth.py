"""Who may see the dashboard: the API's own read rule, with the token also taken from a cookie.

A browser cannot put a bearer header on a page navigation, so the login form stores the token in
`sessionStorage` (for the JavaScript that calls the API) and in a same-site session cookie (for
page loads). The cookie is only read on these read-only pages; every write still needs the
`Authorization` header, which a cross-site form cannot send.
"""

from __future__ import annotations

from fastapi import HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials

from service.api.deps import Credentials, SettingsDep, check_reader

TOKEN_COOKIE = "fxtune_token"


class LoginRequired(Exception):
    """A dashboard page was refused; the app answers with the login page instead of JSON."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail


def require_page_reader(request: Request, settings: SettingsDep, creds: Credentials) -> None:
    if creds is None and (cookie := request.cookies.get(TOKEN_COOKIE)):
        creds = HTTPAuthorizationCredentials(scheme="Bearer", credentials=cookie)
    try:
        check_reader(request, settings, creds)
    except HTTPException as exc:
        raise LoginRequired(exc.status_code, str(exc.detail)) from None
