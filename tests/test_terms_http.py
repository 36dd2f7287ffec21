"""The paid terms over HTTP and the command line: `/v1/lanes` shows the configured and effective
ceiling and consent (and who set them) and each host's view of the day; `POST /v1/ceiling` (an
admin's) and `lanes ceiling set` set the store's terms (issue 28, Build 4)."""

from __future__ import annotations

import contextlib
import io
import os

import httpx2
import trio

from lanes._cli import main
from sidecar import CLIENT_KEY, open_sidecar

ADMIN_KEY = "lanes-admin-key-0123456789abcdef"


async def test_v1_lanes_shows_configured_and_effective_terms_and_an_admin_sets_them(tmp_path):
    """`/v1/lanes` shows the configured and the effective terms (and who set them) and each
    host's view of the day; `POST /v1/ceiling` needs an admin key and can not be forged from a
    page, refuses a bad ceiling naming the field, and sets the store's terms; `lanes ceiling`
    shows them."""
    server = {"clients": {"alice": "CLIENT_KEY"}, "admin_key_env": "ADMIN_KEY"}
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    async with (
        open_sidecar(
            ("paid", "paid", ["paid-model"]),
            policy={"free_tier_fallback": "ask", "paid_ceiling_usd_per_day": 0.5},
            server=server,
            env={"ADMIN_KEY": ADMIN_KEY},
            state=str(tmp_path / "s.db"),
        ) as (url, _),
        httpx2.AsyncClient(trust_env=False, timeout=10) as http,
    ):
        before = (await http.get(f"{url}/lanes", headers=admin)).json()
        as_client = await http.post(
            f"{url}/ceiling", json={"usd": 5}, headers={"authorization": f"Bearer {CLIENT_KEY}"}
        )
        forged = [
            (
                await http.post(f"{url}/ceiling", content=b'{"usd": 5}', headers={**admin, **extra})
            ).status_code
            for extra in (
                {"content-type": "text/plain"},
                {"content-type": "application/json", "origin": "http://evil.example"},
            )
        ]
        bad = [
            (await http.post(f"{url}/ceiling", json=body, headers=admin)).json()["error"]["param"]
            for body in ({"usd": -1}, {"usd": True}, {"usd": 2e6}, {"consent": "maybe"}, {})
        ]
        set_ = await http.post(f"{url}/ceiling", json={"usd": 2.5, "consent": "off"}, headers=admin)
        after = (await http.get(f"{url}/lanes", headers=admin)).json()
        base = url.removesuffix("/v1")
        shown = await trio.to_thread.run_sync(
            lambda: _run(main, ["ceiling", "--url", base], {"LANES_KEY": ADMIN_KEY})
        )
    assert before["paid"]["configured"] == {"ceiling_usd": 0.5, "consent": "ask"}
    assert before["paid"]["effective"]["ceiling_usd"] == 0.5
    assert before["clock"]["agrees"] is True and before["clock"]["source"] == "the host's clock"
    assert [h["ceiling_usd"] for h in before["clock"]["hosts"]] == [0.5]
    assert as_client.status_code == 403 and forged == [415, 403]
    assert bad == ["usd", "usd", "usd", "consent", "usd"]
    assert set_.status_code == 200
    assert set_.json()["effective"]["ceiling_usd"] == 2.5
    assert after["paid"]["ceiling_usd"] == 2.5 and after["paid"]["fallback"] == "off"
    assert after["paid"]["effective"]["ceiling_set_by"].startswith("operator via ")
    assert after["paid"]["configured"] == {"ceiling_usd": 0.5, "consent": "ask"}
    assert shown[0] == 0 and "paid ceiling $2.5/day (set by operator via" in shown[1]


def _run(main, argv, env):
    """`lanes …` in this process with `env` set: (exit code, what it printed)."""
    out = io.StringIO()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out):
            code = main(argv)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return code, out.getvalue()
