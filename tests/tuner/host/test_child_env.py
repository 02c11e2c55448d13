"""What a child's relayed text loses: the caller's secrets and passwords written into URLs."""

from __future__ import annotations

import time

import pytest

from tuner.host.child_env import REDACTED, Redactor


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("see postgresql://fxtune:hunter2secret@db:5432/x", "postgresql://fxtune:"),
        ("URL=postgresql+psycopg://u:longpassword@h/db", "postgresql+psycopg://u:"),
        ("(https://user:s3cretpass@example.com/)", "https://user:"),
        ("9git://w:tokentoken@h/", "9git://w:"),  # a run starting with a digit still masks
    ],
)
def test_passwords_in_urls_are_masked(text: str, masked: str) -> None:
    out = Redactor()(text)
    assert f"{masked}{REDACTED}@" in out
    assert "secret" not in out and "password" not in out and "tokentoken" not in out


def test_the_callers_secrets_are_masked_wherever_they_appear() -> None:
    out = Redactor(["worker-secret-abcdef", "short"])("a worker-secret-abcdef; short")
    assert out == f"a {REDACTED}; short"  # under 6 characters: would mask ordinary words


def test_a_long_run_of_letters_is_redacted_in_linear_time() -> None:
    """A child's stderr tail is 64 KB; the URL pattern once restarted inside every run of
    letters, 25 s of CPU for that (a minute for this text). It takes milliseconds now."""
    text = "z" * 100_000 + " http://u:passpass@h/"
    start = time.process_time()
    out = Redactor()(text)
    assert time.process_time() - start < 1.0
    assert out.endswith(f"http://u:{REDACTED}@h/")
