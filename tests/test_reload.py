"""One config per host, and a reload that is a decision: the pure parts (what changed between two
files, how restarts back off), the worker's view of its parent's status (`/ready`, `/v1/lanes`),
and `POST /v1/reload` on a single process. The processes themselves: `test_workers.py`."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from lanes._cli import main
from lanes._core.config.schema import load_config
from lanes._core.model.errors import ConfigError
from lanes._core.source import Source, changed_keys, read_source, said
from lanes._http.running import Running
from lanes._http.server import serve
from lanes._http.team import MAX_RESTART_S, restart_delay_s
from lanes.harness.configs import KEYS, local_lane
from lanes.testing import open_fake

NAMES = st.text("abcxyz_", min_size=1, max_size=4)
LEAVES = st.one_of(st.integers(), st.booleans(), st.text(max_size=4), st.floats(allow_nan=False))
TABLES = st.recursive(
    st.dictionaries(NAMES, LEAVES, max_size=4),
    lambda inner: st.dictionaries(NAMES, st.one_of(LEAVES, inner), max_size=4),
    max_leaves=12,
)


@given(TABLES)
def test_a_file_compared_with_itself_changed_nothing(table):
    """`changed_keys` of a table and an equal copy is empty."""
    assert changed_keys(table, json.loads(json.dumps(table))) == []


@given(TABLES, NAMES, st.integers())
def test_one_changed_value_is_named_by_its_key_and_never_shown(table, key, value):
    """Setting one top-level key to a new value names exactly that key — never the value."""
    secret = f"sk-{value}-secret"
    changed = {**table, key: secret}
    found = changed_keys(table, changed)
    assert found == ([] if table.get(key) == secret else [key])
    assert secret not in said(found)


def test_lanes_are_compared_by_name_and_order():
    """A lane's changed key is named under its name; a lane added is named; a new order is said."""
    one = {"name": "one", "rpm": 5}
    two = {"name": "two", "base_url": "http://127.0.0.1:1/v1"}
    old = {"lanes": [one, two], "policy": {"paid_ceiling_usd_per_day": 0.002}}
    assert changed_keys(old, {**old, "lanes": [{**one, "rpm": 6}, two]}) == ["lanes.one.rpm"]
    assert changed_keys(old, {**old, "lanes": [one]}) == ["lanes.two"]
    assert changed_keys(old, {**old, "lanes": [two, one]}) == ["lanes (order)"]
    assert changed_keys(old, {"lanes": [one, two], "policy": {}}) == [
        "policy.paid_ceiling_usd_per_day"
    ]


def test_said_names_at_most_a_dozen_keys():
    """The change line names a dozen keys and counts the rest; none at all says so."""
    keys = [f"aliases.a{i}" for i in range(15)]
    assert said(keys).endswith("aliases.a11 and 3 more")
    assert said([]) == "no key changed (comments or layout only)"


@given(st.integers(min_value=0, max_value=10_000))
def test_restarts_back_off_exponentially_up_to_the_cap(failures):
    """No wait after a worker that had served a while; then 0.5 s doubling, never past 30 s, and
    never shorter for more failures."""
    delay = restart_delay_s(failures)
    assert 0.0 <= delay <= MAX_RESTART_S
    assert delay <= restart_delay_s(failures + 1)
    assert [restart_delay_s(n) for n in range(8)] == [0, 0.5, 1, 2, 4, 8, 16, 30]


def test_a_source_is_its_bytes_hash_and_names_the_file_in_errors(tmp_path):
    """The hash is `sha256sum`'s; `${NAME}` is filled from the environment given; a bad value is
    an error naming the file and the key; a read failure names the file."""
    path = tmp_path / "lanes.toml"
    path.write_bytes(b'[policy]\npaid_ceiling_usd_per_day = "${CEILING}"\n')
    source = read_source(path)
    assert source.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    config = source.check({"CEILING": "0.25"})
    assert config.policy.paid_ceiling_usd_per_day == 0.25
    named = rf"(?s)^{re.escape(str(path))}: .*policy.paid_ceiling_usd_per_day"
    with pytest.raises(ConfigError, match=named) as bad:
        source.check({"CEILING": "-1"})
    assert bad.value.key == "policy.paid_ceiling_usd_per_day"
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: not valid TOML"):
        Source(where=str(path), data=b"[policy\n").check({})
    with pytest.raises(ConfigError, match=r"cannot read config"):
        read_source(tmp_path / "missing.toml")


def status_file(path: Path, serving: dict[int, bool]) -> Running:
    path.write_text(
        json.dumps(
            {
                "sha256": "ab" * 32,
                "workers": [
                    {"worker": n, "pid": 100 + n, "sha256": "ab" * 32, "serving": up}
                    for n, up in serving.items()
                ],
                "reloads": 0,
                "last_reload": None,
            }
        )
    )
    return Running(sha256="ab" * 32, worker=1, parent_pid=1, status_path=str(path))


async def test_ready_is_503_while_a_worker_is_missing_and_lanes_show_the_hash(tmp_path):
    """Under a parent whose status says worker 2 of 2 is not serving, `/ready` answers 503 naming
    it (200 once it serves again), and `/v1/lanes` shows this worker's hash and the parent's
    view."""
    running = status_file(tmp_path / "status.json", {1: True, 2: False})
    async with open_fake("local", models=("local-model",)) as local, trio.open_nursery() as nursery:
        config = load_config(
            {"lanes": [local_lane("local", local.base_url)], "server": {"port": 0}}, env={}
        )
        url = await nursery.start(
            lambda task_status: serve(config, env=KEYS, running=running, task_status=task_status)
        )
        async with httpx2.AsyncClient(base_url=url, trust_env=False) as http:
            missing = await http.get("/ready")
            view = (await http.get("/v1/lanes")).json()["config"]
            status_file(tmp_path / "status.json", {1: True, 2: True})
            whole = await http.get("/ready")
        nursery.cancel_scope.cancel()
    assert missing.status_code == 503 and missing.json()["workers"] == {
        "serving": 1,
        "of": 2,
        "missing": [2],
    }
    assert "worker 2 of 2 not serving" in missing.json()["reason"]
    assert whole.status_code == 200 and whole.json()["workers"]["missing"] == []
    assert view["sha256"] == "ab" * 32 and view["worker"] == 1
    assert [w["worker"] for w in view["host"]["workers"]] == [1, 2]


async def test_a_single_process_refuses_a_reload_and_shows_its_hash(tmp_path, capsys):
    """One `lanes serve` process: `/v1/lanes` (and `lanes status`) show the hash of the file it
    read, and `POST /v1/reload` is 409, saying how to reload; from a form's body type it is 415
    first."""
    async with open_fake("local", models=("local-model",)) as local:
        path = tmp_path / "lanes.toml"
        path.write_text(
            f'[server]\nport = 0\n[[lanes]]\nname = "local"\nmodule = "openai_compatible"\n'
            f'base_url = "{local.base_url}"\nfree_tier = {{ kind = "local" }}\n'
            '[[lanes.models]]\nid = "local-model"\n'
        )
        async with trio.open_nursery() as nursery:
            url = await nursery.start(
                lambda task_status: serve(path, env=KEYS, task_status=task_status)
            )
            async with httpx2.AsyncClient(base_url=url, trust_env=False) as http:
                view = (await http.get("/v1/lanes")).json()["config"]
                refused = await http.post("/v1/reload", json={})
                forged = await http.post(
                    "/v1/reload", content=b"{}", headers={"content-type": "text/plain"}
                )
                ready = (await http.get("/ready")).json()
            code = await trio.to_thread.run_sync(main, ["status", "--url", url])
            nursery.cancel_scope.cancel()
    assert view == {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "reload_unsupported"
    assert "--workers" in refused.json()["error"]["message"]
    assert forged.status_code == 415 and "workers" not in ready
    assert code == 0 and f"\nconfig {view['sha256'][:12]}\n" in capsys.readouterr().out


# -- a reload never lowers the guard silently --------------------------------------------------


GUARD_SERVER: dict[str, Any] = {"clients": {"ci": "CI_KEY"}, "admin_key_env": "ADMIN_KEY"}
GUARD_POLICY: dict[str, Any] = {"paid_ceiling_usd_per_day": 1.0, "free_tier_fallback": "ask"}


def _guarded(server: dict[str, Any] = GUARD_SERVER, policy: dict[str, Any] = GUARD_POLICY):
    tables = {"lanes": [{"name": "ollama"}], "server": server, "policy": policy}
    return load_config(tables, env={"CI_KEY": "k", "ADMIN_KEY": "a"})


@pytest.mark.parametrize(
    ("server", "policy", "named"),
    [
        ({"admin_key_env": "ADMIN_KEY"}, GUARD_POLICY, "server.clients: all 1 client keys dropped"),
        (
            {"clients": {"ci": "CI_KEY"}},
            GUARD_POLICY,
            "server.admin_key_env: the admin key dropped",
        ),
        (
            GUARD_SERVER,
            {**GUARD_POLICY, "paid_ceiling_usd_per_day": 5.0},
            "policy.paid_ceiling_usd_per_day: the paid ceiling raised",
        ),
        (
            GUARD_SERVER,
            {**GUARD_POLICY, "free_tier_fallback": "allow"},
            "policy.free_tier_fallback: a more permissive consent mode",
        ),
    ],
)
def test_each_way_a_config_lowers_the_guard_is_named(server, policy, named):
    """Dropping every client key or the admin key, raising the ceiling or the consent mode is
    named by its key; the same config, a lower ceiling or a stricter mode lowers nothing."""
    from lanes._core.config.lowering import guard_lowered

    (said,) = guard_lowered(_guarded(), _guarded(server, policy))
    assert said.startswith(named)
    stricter = _guarded(policy={"paid_ceiling_usd_per_day": 0.5, "free_tier_fallback": "off"})
    assert guard_lowered(_guarded(), _guarded()) == [] == guard_lowered(_guarded(), stricter)
