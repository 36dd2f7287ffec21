"""Keys are checked where they are read, and no log line at any level ever shows one."""

from __future__ import annotations

import logging

import httpx2
import pytest

from lanes._core.secrets import install_log_redaction, read_key, redact_log
from lanes.testing import answer, status
from sidecar import open_sidecar

GOOD = "sk-good-Qx7Vb2Lm9Tz4Rk8Wn3"
FAILING = "sk-fail-Hj5Pd8Cs2Yf6Ug1Ea4"
BROKEN = "sk-brok-Mv3Nq7Zx1Kt5Wr9Bp2"
CLIENT = "lanes-client-Gd4Js8Lf2Xc6"


def test_a_key_is_stripped_of_surrounding_whitespace():
    """Spaces, tabs and a Windows line ending around a key are dropped."""
    assert read_key({"K": f" \t{GOOD}\r\n"}, "K") == (GOOD, "")
    assert read_key({"K": f"{GOOD}\n"}, "K") == (GOOD, "")


@pytest.mark.parametrize("inside", ["\r", "\n", "\t", "\x00", "\x7f", "é", "\u200b"])
def test_a_key_with_anything_unprintable_inside_is_refused_by_name(inside):
    """A control or non-printable character left inside refuses the key; the reason names the
    variable and never shows the value."""
    key, why = read_key({"ACME_KEY": f"{GOOD[:8]}{inside}{GOOD[8:]}"}, "ACME_KEY")
    assert key is None
    assert "ACME_KEY" in why and "non-printable" in why
    assert GOOD[:8] not in why and GOOD[8:] not in why


def test_an_unset_or_blank_key_is_not_set():
    """An unset variable and one holding only whitespace read the same: not set."""
    assert read_key({}, "K") == (None, "K is not set")
    assert read_key({"K": " \r\n"}, "K") == (None, "K is not set")


@pytest.mark.parametrize(
    "line",
    [
        "Authorization: Bearer abc.def",
        "headers={'authorization': 'Basic dXNlcjpwYXNz'}",
        "[(b'Authorization', b'Bearer abc'), (b'x-api-key', b'xyz123')]",
        '{"x-api-key": "xyz123"}',
        "proxy-authorization=token123 next",
        "Illegal header value b'Bearer abc\\r'",
    ],
)
def test_header_shaped_secrets_are_redacted(line):
    """Authorization and x-api-key values and bearer tokens are redacted in any shape."""
    out = redact_log(line)
    assert "[redacted]" in out
    for secret in ("abc", "dXNlcjpwYXNz", "xyz123", "token123"):
        assert secret not in out


async def test_no_log_line_at_debug_shows_a_key(caplog):
    """Keys with stray whitespace and line endings, at DEBUG through a succeeding and a failing
    upstream: every line of every logger (the HTTP libraries' included) is free of every key, and
    the malformed key is refused in one line that names its variable."""
    install_log_redaction()
    caplog.set_level(logging.DEBUG)
    env = {
        "GOOD_KEY": f" \t{GOOD}\r\n",
        "FAIL_KEY": f"{FAILING}\r",
        "BROKEN_KEY": f"{BROKEN[:7]}\r\n{BROKEN[7:]}",
        "ALICE_KEY": f"\t{CLIENT} \n",
    }
    echo = {"error": {"message": f"Incorrect API key provided: {FAILING}", "code": "invalid_key"}}
    async with open_sidecar(
        ("good", "local", ["local-model"], {"api_key_env": "GOOD_KEY"}),
        ("failing", "paid", ["paid-model"], {"api_key_env": "FAIL_KEY"}),
        ("broken", "paid", ["other-model"], {"api_key_env": "BROKEN_KEY"}),
        server={"clients": {"alice": "ALICE_KEY"}},
        env=env,
    ) as (url, fakes):
        fakes["good"].script("local-model", answer())
        fakes["failing"].script("paid-model", status(401, echo))
        headers = {"Authorization": f"Bearer {CLIENT}"}
        async with httpx2.AsyncClient(trust_env=False, timeout=10, headers=headers) as http:
            body = {"messages": [{"role": "user", "content": "hi"}]}
            ok = await http.post(
                f"{url}/chat/completions", json={**body, "model": "good/local-model"}
            )
            failed = await http.post(
                f"{url}/chat/completions", json={**body, "model": "failing/paid-model"}
            )
            streamed = await http.post(
                f"{url}/chat/completions",
                json={**body, "model": "good/local-model", "stream": True},
            )
        library = logging.getLogger("httpcore2.http11")
        library.debug("send headers=%r", [(b"Authorization", f"Bearer {GOOD}".encode())])
        library.debug("headers {'x-api-key': '%s'}", FAILING)
        try:
            raise ValueError(f"Illegal header value b'Bearer {GOOD}\\r'")
        except ValueError:
            logging.getLogger("httpx2").exception("request failed")
    assert ok.status_code == 200 and streamed.status_code == 200
    assert failed.status_code == 401
    assert fakes["good"].requests()[0].authorization
    text = caplog.text
    lines = text.splitlines()
    assert len(lines) > 20, "DEBUG logging reached the libraries"
    for key in (GOOD, FAILING, BROKEN, CLIENT, BROKEN[:7], BROKEN[7:]):
        leaked = [line for line in lines if key in line]
        assert not leaked, leaked
    refused = [line for line in lines if "BROKEN_KEY" in line]
    assert len(refused) == 1 and "non-printable" in refused[0]
    assert "[redacted]" in text
    assert failed.json()["error"]["message"].count(FAILING) == 0
