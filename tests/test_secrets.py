"""Keys are checked where they are read, and no log line at any level ever shows one."""

from __future__ import annotations

import json
import logging
import random
import string
from typing import Any

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

import lanes
from helpers import config, free_lane
from lanes._core.audit.report import explain
from lanes._core.model.errors import RetryableError
from lanes._core.model.untrusted import MAX_CODE, MAX_MESSAGE, shown
from lanes._core.runtime.secrets import install_log_redaction, read_key, redact_log
from lanes._core.state.store import SQLiteStore
from lanes._core.upstream.lane import OpenAICompatibleLane
from lanes._core.upstream.responses import check_completion, classify_status
from lanes.testing import answer, open_fake, raw, status
from sidecar import open_sidecar

GOOD = "sk-good-Qx7Vb2Lm9Tz4Rk8Wn3"
FAILING = "sk-fail-Hj5Pd8Cs2Yf6Ug1Ea4"
BROKEN = "sk-brok-Mv3Nq7Zx1Kt5Wr9Bp2"
CLIENT = "lanes-client-Gd4Js8Lf2Xc6"
PASTED_KEY = "gsk_live_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcd"  # a key where its name goes


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


def test_a_key_pasted_as_the_variable_name_is_never_shown():
    """A key written where its variable's name goes: the reason a lane is off never shows it."""
    key, why = read_key({}, PASTED_KEY)
    assert key is None and PASTED_KEY not in why and "reads like a key" in why
    assert read_key({"GROQ_API_KEY": "x" * 8}, "GROQ_API_KEY") == ("x" * 8, "")  # a name is shown
    assert read_key({}, "GROQ_API_KEY") == (None, "GROQ_API_KEY is not set")


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


# -- what an upstream says: redacted, stripped and bounded before anything shows it --------------

ECHO_KEY = "b7Q2xK9mN4pL8vR3tY6wZ1cF5hJ0dS2a"  # 32 letters and digits, a shape several issue
OWN_KEY = "Hn3Kd8Lq2Wx7Rt5Vb9Mz4Pc6Yf1Gs0Ja"  # a client's own key for a byok lane
STRANGER = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b"  # a key lanes was never told of
HEADER_KEY = "hdr-secret-4471-alpha"  # not key-shaped: only known by value
FORGED = "bad\r\nINFO lanes: a forged line\x1b[31m\x1b]0;pwned\x07\u202e"
CONTROLS = ("\r", "\n", "\x1b", "\x07", "\u202e", "\x00")


def _sse(*events: dict[str, Any]) -> Any:
    chunks = tuple(f"data: {json.dumps(e)}\n\n".encode() for e in events)
    return raw(200, headers={"content-type": "text/event-stream"}, chunks=lambda: chunks)


@pytest.mark.free_lane  # its lanes are borrowed-free ones
async def test_no_key_from_an_upstream_reaches_any_observable(tmp_path, caplog):
    """An upstream that echoes the lane's key (32 letters and digits) in a 200 error body, a
    client's own key in a stream's error event and a 200 error, a key lanes never knew and the
    value of a secret header the lane's config adds in a 5xx,
    keys in its catalog's model ids, and CR/LF/ANSI/OSC/bidi in its error `code`: no key reaches
    the client's error bodies, a log line, the audit, a story, /v1/lanes, /v1/models, the page
    or /metrics; no control character reaches an error or a log line; lanes' own request ids
    (32 hex characters) are left as they are."""
    install_log_redaction()
    caplog.set_level(logging.DEBUG)
    configured = ["in-200", "in-code", "in-500"]
    catalog = [*configured, "found-model", f"key-{ECHO_KEY}", f"sk-{STRANGER}"]
    echo = {
        "api_key_env": "ECHO_KEY",
        "discover": True,
        "models": [{"id": m} for m in configured],
        "headers": {"X-Api-Key": HEADER_KEY},  # a secret header the lane's config adds
    }
    own = {"byok": True, "free_tier": {"kind": "rate_limited"}}
    async with open_sidecar(
        ("echo", "free", catalog, echo),
        ("mine", "free", ["own-model"], own),
        policy={"free_tier_fallback": "off"},
        env={"ECHO_KEY": ECHO_KEY},
        state=str(tmp_path / "state.db"),
    ) as (url, fakes):
        echoed = {"error": {"message": f"key {ECHO_KEY} is not allowed", "code": FORGED}}
        fakes["echo"].script("in-200", status(200, echoed))
        refused = {"error": {"message": "no", "code": FORGED * 9}}
        fakes["echo"].script("in-code", status(400, refused))
        failed = {"error": {"message": f"key {STRANGER} failed; header {HEADER_KEY}"}}
        fakes["echo"].script("in-500", status(500, failed))
        fakes["echo"].script("found-model", answer())
        fakes["mine"].script(
            "own-model",
            _sse({"error": {"message": f"key {OWN_KEY} revoked", "code": FORGED}}),
            status(200, {"error": {"message": f"key {OWN_KEY} is not allowed"}}),
        )
        base, seen, answers = url.removesuffix("/v1"), [], []
        async with httpx2.AsyncClient(trust_env=False, timeout=10) as http:
            for model, extra, stream in (
                ("echo/in-200", {}, False),
                ("echo/in-code", {}, False),
                ("echo/in-500", {}, False),
                ("echo/found-model", {}, False),  # only in the catalog: read it first
                ("mine/own-model", {"x-lanes-key-mine": OWN_KEY}, True),
                ("mine/own-model", {"x-lanes-key-mine": OWN_KEY}, False),
            ):
                body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
                answers.append(
                    await http.post(
                        f"{url}/chat/completions", json={**body, "stream": stream}, headers=extra
                    )
                )
            for path in ("/", "/metrics", "/v1/lanes", "/v1/models", "/v1/report"):
                seen.append((await http.get(base + path)).text)
    ids = [a.headers["x-lanes-request-id"] for a in answers]
    store = SQLiteStore(str(tmp_path / "state.db"))  # the sidecar's last sync wrote the audit
    stories = [explain(store.records.query, i) for i in ids]  # what /v1/requests/{id} answers
    store.close()
    # the state file, its log, and the batch queue beside it (every file in its folder)
    kept = [
        p
        for p in tmp_path.rglob("*")
        if p.is_file() and p.relative_to(tmp_path).parts[0].startswith("state.db")
    ]
    files = b"".join(p.read_bytes() for p in kept)
    logged = [r.getMessage() for r in caplog.records]
    errors = [a.json()["error"] for a in answers if a.status_code != 200]
    seen += [a.text for a in answers] + [json.dumps(dict(a.headers)) for a in answers]
    seen += [json.dumps(s) for s in stories] + logged
    assert [a.status_code for a in answers] == [503, 400, 503, 200, 503, 503]
    assert "found-model" in seen[3]  # /v1/models: the catalog was read
    assert all(stories)
    for key in (ECHO_KEY, OWN_KEY, STRANGER, HEADER_KEY):
        leaked = [text for text in seen if key in text]
        assert not leaked, leaked
        assert key.encode() not in files
    for field in [e["message"] for e in errors] + [e["code"] for e in errors] + logged:
        assert not any(c in field for c in CONTROLS), field
    assert len(errors[1]["code"]) <= 64 and errors[1]["code"].startswith("bad INFO lanes")
    assert not any(line.startswith("INFO lanes: a forged") for line in caplog.text.splitlines())
    assert all(any(i in line for line in logged) for i in ids)  # our own ids: never redacted


async def test_a_requests_own_key_is_out_of_every_log_line_made_while_it_is_served(
    caplog, monkeypatch, env, autojump_clock
):
    """A key that arrives with a request (bring your own key) is redacted from every log line
    made while that request is served, streamed or not — in any logger, in any shape — and is
    not remembered for ever: the same text logged after the request is not touched."""
    install_log_redaction()
    caplog.set_level(logging.DEBUG)
    library = logging.getLogger("httpcore2.http11")
    complete, open_stream = OpenAICompatibleLane.complete, OpenAICompatibleLane.open_stream

    async def chatty_complete(self, job, model, **kw):
        library.debug("sending %s with %s", model, job.keys)  # a library that says too much
        return await complete(self, job, model, **kw)

    def chatty_stream(self, job, model, **kw):
        library.debug("streaming %s with %s", model, job.keys)
        return open_stream(self, job, model, **kw)

    monkeypatch.setattr(OpenAICompatibleLane, "complete", chatty_complete)
    monkeypatch.setattr(OpenAICompatibleLane, "open_stream", chatty_stream)
    async with open_fake("own", models=("m:free",)) as own:
        table = free_lane("own", own.base_url, models=["m:free"], byok=True)
        async with lanes.open_dispatcher(config(table), env=env) as d:
            job = lanes.Job(messages=[{"role": "user", "content": "hi"}], keys={"own": OWN_KEY})
            await d.complete(job)
            async with d.open_stream(job) as stream:
                async for _ in stream:
                    pass
    library.debug("after the request: %s", OWN_KEY)
    lines = [r.getMessage() for r in caplog.records]
    during = [line for line in lines if line.startswith(("sending", "streaming"))]
    assert len(during) == 2 and all("[redacted]" in line for line in during), during
    assert [line for line in lines if OWN_KEY in line] == [f"after the request: {OWN_KEY}"]


def test_an_upstream_error_code_can_not_forge_a_line_or_carry_a_key():
    """CR/LF, ANSI and OSC escapes and bidi overrides in an upstream's error `code` are stripped
    from the error's message and code, the code is bounded, and a key in it is redacted."""
    code = f"{FORGED}{ECHO_KEY} " * 10
    for status_code in (400, 429, 500):
        error = classify_status(status_code, {}, {"error": {"message": "m", "code": code}})
        for text in (str(error), error.code or ""):
            assert not any(c in text for c in CONTROLS) and ECHO_KEY not in text, text
        assert error.code is not None and len(error.code) <= MAX_CODE


def test_an_error_inside_a_200_is_redacted_with_the_lanes_secrets():
    """A 200 whose body is an error echoing the key is redacted with the secrets it was sent
    with — a key of any shape, known by value."""
    uuid_key = "3f0c9a52-1b7e-4d8a-9c61-0e5b2f7d4a19"  # a key shaped like a UUID: known by value
    for key in (ECHO_KEY, uuid_key):
        with pytest.raises(RetryableError) as failed:
            check_completion({"error": {"message": f"key {key} is not allowed"}}, (key,))
        assert key not in str(failed.value) and "[redacted]" in str(failed.value)


def _keys(make: Any, count: int = 200) -> list[str]:
    rng = random.Random(28)  # deterministic: the same keys every run
    return [make(rng) for _ in range(count)]


def _chars(rng: random.Random, alphabet: str, size: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(size))


ALNUM = string.ascii_letters + string.digits
URLSAFE = ALNUM + "-_"
SHAPES = {
    "32 alphanumeric": lambda r: _chars(r, ALNUM, 32),
    "32 hex": lambda r: _chars(r, string.hexdigits.lower(), 32),
    "64 hex": lambda r: _chars(r, string.hexdigits.lower(), 64),
    "sk-": lambda r: "sk-" + _chars(r, ALNUM, 48),
    "sk-proj-": lambda r: "sk-proj-" + _chars(r, URLSAFE, 120),
    "sk-ant-": lambda r: "sk-ant-api03-" + _chars(r, URLSAFE, 93) + "AA",
    "sk-or-v1-": lambda r: "sk-or-v1-" + _chars(r, string.hexdigits.lower(), 64),
    "gsk_": lambda r: "gsk_" + _chars(r, ALNUM, 52),
    "csk-": lambda r: "csk-" + _chars(r, string.ascii_lowercase + string.digits, 48),
    "xai-": lambda r: "xai-" + _chars(r, ALNUM, 80),
    "hf_": lambda r: "hf_" + _chars(r, string.ascii_letters, 34),
    "AIza": lambda r: "AIza" + _chars(r, URLSAFE, 35),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_key_shapes_providers_issue_are_redacted_unknown(shape):
    """Keys of the shapes providers issue are redacted from an upstream's words even when lanes
    was never told of them (200 random keys of each shape)."""
    for key in _keys(SHAPES[shape]):
        text = f'Incorrect API key provided: {key}. Find yours at "{key}", (key={key})'
        out = shown(text)
        assert key not in out and out.count("[redacted]") == 3, (key, out)


ORDINARY = [
    "gpt-4o-mini-2024-07-18",
    "text-embedding-3-small",
    "open-mistral-nemo-2407",
    "llama3-groq-70b-8192-tool-use-preview",
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
    "nvidia/Llama-3_1-Nemotron-Ultra-253B-v1",
    "mlx-community-Meta-Llama-3-8B-Instruct-4bit",
    "NousResearch-Nous-Hermes-2-Mixtral-8x7B-DPO",
    "accounts/fireworks/models/llama-v3p1-405b-instruct",
    "rate_limit_exceeded_for_model",
    "context_length_exceeded",
    "insufficient_quota",
    "NullPointerException",
    "AbstractSingletonProxyFactoryBean",
    "internationalization",
    "2024-07-18T12:00:00.000000Z",
    "12345678901234567890123",
    "3f0c9a52-1b7e-4d8a-9c61-0e5b2f7d4a19",
    "This model's maximum context length is 8192 tokens.",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_words_and_ids_are_not_key_shaped(text):
    """Model ids, error codes, class names, dates, numbers, UUIDs and prose are shown as sent."""
    assert shown(text) == text


secret_text = st.text(alphabet=URLSAFE + "!#$%&*+./:;<=>?@^~", min_size=4, max_size=64)
splitters = st.sampled_from(["", "\x1b[0m", "\x00", "\u202e", "\x1b]0;title\x07", "\x9b1m", "\r"])


@given(
    secret=secret_text,
    before=st.text(max_size=600),
    after=st.text(max_size=600),
    splitter=splitters,
    at=st.integers(0, 64),
    limit=st.integers(1, 400),
)
def test_what_an_upstream_says_is_shown_bounded_clean_and_without_the_secret(
    secret, before, after, splitter, at, limit
):
    """For any text around a known secret — split by an escape sequence or a control character,
    or not — what is shown holds no secret, no control or format character, and at most `limit`
    characters."""
    out = shown(before + secret[:at] + splitter + secret[at:] + after, (secret,), limit=limit)
    assert secret not in out and len(out) <= limit
    assert out.isprintable(), repr(out)


def test_a_long_text_cut_off_leaves_no_half_of_a_key():
    """A key that straddles the point where a long text (or a value made text) is cut, before
    whitespace and escapes collapse, is dropped whole, not shown in part."""
    size = 4 * MAX_MESSAGE  # what is read of a text, at most
    for part in (4, 16, 31):
        for filler in (" ", "\x1b[0m", "\u202e"):
            room = size - len("word ") - part
            prefix = "word " + " " * (room % len(filler)) + filler * (room // len(filler))
            out = shown(prefix + ECHO_KEY + " tail", (ECHO_KEY,))
            assert out == "word", (part, filler, out)
    listed = shown(["word" + " " * (size - 16), ECHO_KEY], (ECHO_KEY,))  # not text: made text
    assert ECHO_KEY[:4] not in listed, listed
