"""Caller identities and the dashboard's session cookie: signed, expiring, bound to the token."""

from __future__ import annotations

from service.api.identity import issue_session, session_identity, token_identity

NOW = 1_800_000_000.0


def test_an_identity_is_a_hash_of_the_token_never_the_token() -> None:
    one, other = token_identity("alpha-token"), token_identity("beta-token")
    assert one != other and one.startswith("token-") and "alpha" not in one
    assert token_identity("alpha-token") == one


def test_a_session_names_its_token_identity_until_it_expires() -> None:
    value = issue_session("alpha-token", NOW, 3600)
    assert "alpha-token" not in value
    assert session_identity(value, "alpha-token", NOW + 10) == token_identity("alpha-token")
    assert session_identity(value, "alpha-token", NOW + 3600) is None  # expired
    assert session_identity(value, "beta-token", NOW) is None  # a new token ends it


def test_a_tampered_or_malformed_session_is_nothing() -> None:
    value = issue_session("alpha-token", NOW, 3600)
    version, identity, expiry, mac = value.split(".")
    bad = [
        f"{version}.{identity}.{int(expiry) + 3600}.{mac}",  # extended
        f"{version}.{token_identity('beta-token')}.{expiry}.{mac}",  # someone else
        f"v2.{identity}.{expiry}.{mac}",
        f"{version}.{identity}.{expiry}.{mac[:-1]}",
        f"{version}.{identity}.-1.{mac}",
        "alpha-token",
        "",
        None,
        value + "." + "x" * 300,
        f"{version}.{identity}.{expiry}.{mac}é",
    ]
    for forged in bad:
        assert session_identity(forged, "alpha-token", NOW) is None, forged
