"""The loader: lanes are found by name; a lane that can not load is one log line, never a crash."""

from __future__ import annotations

import sys
import textwrap

import pytest

import lanes
from helpers import config, local_lane, paid_lane
from lanes.testing import open_fake


async def test_missing_module_is_one_log_line_and_the_rest_serve(env, caplog_lanes, autojump_clock):
    """A lane whose module is gone is skipped with exactly one clear line; the others serve."""
    async with open_fake("local", models=("local-model",)) as local:
        cfg = config(
            {"name": "groq", "module": "no_such_lane"}, local_lane("local", local.base_url)
        )
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            reply = await dispatcher.complete(
                lanes.Job(messages=[{"role": "user", "content": "hi"}])
            )
            unavailable = dispatcher.statistics().unavailable
    assert reply.lane == "local"
    lines = [r.getMessage() for r in caplog_lanes.records if "groq" in r.getMessage()]
    assert lines == ["lane groq: module lanes.no_such_lane not found — skipped"]
    assert unavailable == {"groq": "module lanes.no_such_lane not found — skipped"}


async def test_missing_key_switches_the_lane_off(env, caplog_lanes, autojump_clock):
    """A lane whose key variable is unset is off, with one line naming the variable (no value)."""
    async with (
        open_fake("paid", models=("paid-model",)) as paid,
        open_fake("local", models=("local-model",)) as local,
    ):
        cfg = config(
            paid_lane("paid", paid.base_url, api_key_env="NOT_SET_ANYWHERE"),
            local_lane("local", local.base_url),
        )
        async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
            assert list(dispatcher.lanes) == ["local"]
    assert "lane paid: NOT_SET_ANYWHERE is not set — lane off" in caplog_lanes.messages


async def test_broken_and_empty_modules_are_skipped(
    env, caplog_lanes, tmp_path, monkeypatch, autojump_clock
):
    """A lane module that raises on import, or declares no PROVIDER, costs one line each."""
    pkg = tmp_path / "extlanes"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "broken.py").write_text("raise RuntimeError('boom')\n")
    (pkg / "empty.py").write_text("X = 1\n")
    (pkg / "mine.py").write_text(
        textwrap.dedent("""
        from lanes._core.upstream.lane import Provider
        from lanes._core.freetier.kinds import AlwaysFreeLocal
        from lanes._core.config.schema import ModelConfig
        PROVIDER = Provider(
            name="mine",
            base_url="http://127.0.0.1:1/v1",
            free_tier=AlwaysFreeLocal(),
            models=(ModelConfig(id="m"),),
        )
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = config(
        {"name": "a", "module": "extlanes.broken"},
        {"name": "b", "module": "extlanes.empty"},
        {"name": "c", "module": "extlanes.mine"},
        {"name": "d", "module": "ollama", "enabled": False},
    )
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        assert list(dispatcher.lanes) == ["c"]
        assert dispatcher.lanes["c"].candidates[0].tier == "local"
        unavailable = dispatcher.statistics().unavailable
    assert unavailable == {
        "a": "module extlanes.broken failed to import (RuntimeError) — skipped",
        "b": "module extlanes.empty declares no PROVIDER — skipped",
        "d": "disabled in config — skipped",
    }
    sys.modules.pop("extlanes", None)


async def test_no_lanes_at_all_still_starts(env, autojump_clock):
    """With every lane gone the dispatcher still opens and answers jobs with a clear error."""
    async with lanes.open_dispatcher(
        config({"name": "x", "module": "gone"}), env=env
    ) as dispatcher:
        with pytest.raises(lanes.NoLaneAvailable):
            await dispatcher.complete(lanes.Job(messages=[{"role": "user", "content": "hi"}]))


async def test_module_defaults_fill_unset_keys(env, autojump_clock):
    """A lane that names only its module gets the module's URL, kind and catalog."""
    cfg = config({"name": "ollama"}, {"name": "groq"})
    async with lanes.open_dispatcher(
        cfg, env={**env, "GROQ_API_KEY": "gsk_x_0123456789"}
    ) as dispatcher:
        ollama, groq = dispatcher.lanes["ollama"], dispatcher.lanes["groq"]
        assert ollama.spec.base_url == "http://127.0.0.1:11434/v1"
        assert {c.tier for c in ollama.candidates} == {"local"}
        assert {c.tier for c in groq.candidates} == {"free"}
        assert "gsk_x_0123456789" not in repr(groq.__dict__)
