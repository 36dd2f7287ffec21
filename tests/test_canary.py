"""The quality canary: checks and scoring (pure), then runs over fakes that drift on purpose."""

from __future__ import annotations

import json
import subprocess

import pytest
import trio

import lanes
from helpers import config, free_lane, lanes_command, sqlite_store
from lanes.canary.checks import run_checks
from lanes.canary.prompts import CanaryConfig, Checks, Prompt, Settings
from lanes.canary.report import exit_code, markdown, table
from lanes.canary.run import pin, release, report, run_canary
from lanes.canary.score import Answer, score_model
from lanes.testing import ANSWER, answer, open_fake, rate_limited

pytestmark = pytest.mark.free_lane  # the canary probes the free lanes

# -- pure ------------------------------------------------------------------------------------------


def test_checks():
    """expect, contains, JSON keys, tool calls, refusals and length, each judged without a model."""
    assert run_checks(Checks(expect="391"), " 391. ")["expect"]
    assert not run_checks(Checks(expect="391"), "It is 391")["expect"]
    assert run_checks(Checks(contains=["red", "blue"]), "Red, green, BLUE") == {
        "contains:red": True,
        "contains:blue": True,
        "no_refusal": True,
        "length": True,
    }
    assert run_checks(Checks(json_keys=["a"]), '```json\n{"a": 1}\n```')["json"]
    assert not run_checks(Checks(json_keys=["a"]), "{oops")["json"]
    call = {"function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    assert run_checks(Checks(tool_call="get_weather"), "", [call])["tool_call"]
    assert not run_checks(
        Checks(tool_call="get_weather"),
        "",
        [{"function": {"name": "get_weather", "arguments": "{"}}],
    )["tool_call"]
    assert not run_checks(Checks(), "I cannot help with that.")["no_refusal"]
    assert not run_checks(Checks(max_len=5), "too long")["length"]


def answers(texts: dict[str, str], **kw) -> list[Answer]:
    return [
        Answer(prompt=p, status="ok", text=t, checks={"length": True}, **kw)
        for p, t in texts.items()
    ]


def test_scoring_verdicts():
    """Same answers → ok; reworded → drifted; a check now fails → failed; none probed → skipped."""
    base = {a.prompt: a for a in answers({"p1": ANSWER, "p2": "391"})}
    same = score_model(
        "m", answers({"p1": ANSWER, "p2": "391"}), base, similarity_ok=0.85, drift_threshold=0.3
    )
    reworded = score_model(
        "m",
        answers({"p1": "Jackdaws love my big sphinx of quartz.", "p2": "three ninety one"}),
        base,
        similarity_ok=0.85,
        drift_threshold=0.3,
    )
    broken = [
        Answer(prompt="p1", status="ok", text=ANSWER, checks={"length": False}),
        *answers({"p2": "391"}),
    ]
    skipped = score_model(
        "m",
        [Answer(prompt="p1", status="skipped", reason="backoff")],
        base,
        similarity_ok=0.85,
        drift_threshold=0.3,
    )
    assert (same.verdict, same.drift) == ("ok", 0.0)
    assert reworded.verdict == "drifted" and reworded.drift >= 0.3
    assert (
        score_model("m", broken, base, similarity_ok=0.85, drift_threshold=0.3).verdict == "failed"
    )
    assert (skipped.verdict, skipped.reason) == ("skipped", "backoff")
    fingerprint = score_model(
        "m",
        answers({"p1": ANSWER, "p2": "391"}, fingerprint="fp_new"),
        base,
        similarity_ok=0.85,
        drift_threshold=0.3,
    )
    assert fingerprint.drift > 0 and "fingerprint" in fingerprint.reason


def test_a_new_prompt_does_not_shift_when_the_change_began():
    """A prompt added after the pin has no baseline: the first changed answer's time is taken from
    the answer that changed, not from whichever answer stood in its place in the list."""
    base = {a.prompt: a for a in answers({"p2": "391"})}
    now = [
        Answer(prompt="new", status="ok", text="anything", checks={}, at=100.0),
        Answer(prompt="p2", status="ok", text="three ninety one", checks={}, at=200.0),
    ]
    scored = score_model("m", now, base, similarity_ok=0.85, drift_threshold=0.3)
    assert [d.prompt for d in scored.diffs] == ["p2"] and scored.changed_at == 200.0


# -- over fakes ----------------------------------------------------------------------------------

PROMPTS = CanaryConfig(
    settings=Settings(concurrency=2, deadline_s=5),
    prompts=[
        Prompt(
            id=f"p{i}",
            messages=[{"role": "user", "content": f"Say the pangram ({i})."}],
            checks=Checks(contains=["quick brown fox"]),
        )
        for i in range(10)
    ],
)
DRIFTED = (
    "Sure! Here it is: the quick brown fox leaps over a sleepy dog, twice."  # same checks pass
)


async def run_and_report(cfg, env):
    async with lanes.open_dispatcher(cfg, env=env) as dispatcher:
        await run_canary(dispatcher, PROMPTS)
        return report(dispatcher.store, PROMPTS)


async def test_stable_drifted_and_skipped_models(env, tmp_path, autojump_clock):
    """A stable model stays ok; a drifting one is flagged, exits 1 and is skipped by routing until
    re-pinned; a backed-off one is skipped with no request sent."""
    state = str(tmp_path / "canary.db")
    async with (
        open_fake("a", models=("stable",)) as a,
        open_fake("b", models=("drifty",)) as b,
        open_fake("c", models=("parked",)) as c,
    ):
        cfg = config(
            free_lane("a", a.base_url, models=["stable"]),
            free_lane("b", b.base_url, models=["drifty"]),
            free_lane("c", c.base_url, models=["parked"]),
            state=state,
        )
        first = await run_and_report(cfg, env)
        async with lanes.open_dispatcher(cfg, env=env) as d:
            pin(d.store)
        b.script("drifty", answer(text=DRIFTED))  # the provider swaps the model, silently
        c.script("parked", rate_limited(retry_after=3600))
        async with lanes.open_dispatcher(cfg, env=env) as d:
            with pytest.raises(lanes.FreeTierExhausted):
                await d.complete(
                    lanes.Job(messages=[{"role": "user", "content": "x"}], model="c/parked")
                )
        parked_before = len(c.requests())
        second = {r.key: r for r in await run_and_report(cfg, env)}
        async with lanes.open_dispatcher(cfg, env=env) as d:
            with pytest.raises(lanes.NoLaneAvailable) as caught:
                await d.complete(
                    lanes.Job(messages=[{"role": "user", "content": "x"}], model="b/drifty")
                )
            pin(d.store, keys=["b/drifty"])
        async with lanes.open_dispatcher(cfg, env=env) as d:
            repinned = await d.complete(
                lanes.Job(messages=[{"role": "user", "content": "x"}], model="b/drifty")
            )
    assert {r.verdict for r in first} == {"ok"}
    assert second["a/stable"].verdict == "ok"
    assert second["b/drifty"].verdict == "drifted" and exit_code(list(second.values())) == 1
    assert second["c/parked"].verdict == "skipped" and len(c.requests()) == parked_before
    assert "quarantined by the canary (drifted" in caught.value.skips[-1].reason
    assert repinned.lane == "b"
    assert "b/drifty" in table(list(second.values())) and "| `b/drifty` | drifted |" in markdown(
        list(second.values())
    )


async def test_probes_count_against_the_quota(env, tmp_path, autojump_clock):
    """Ten prompts against a model with rpd=6: six probes go out, the rest skipped, not forced."""
    async with open_fake("a", models=("m",)) as a:
        cfg = config(
            free_lane("a", a.base_url, models=["m"], free_tier={"kind": "rate_limited", "rpd": 6}),
            state=str(tmp_path / "q.db"),
        )
        async with lanes.open_dispatcher(cfg, env=env) as d:
            await run_canary(d, PROMPTS)
            rows = sqlite_store(d).records.query(
                "SELECT status, COUNT(*) FROM canary_answer GROUP BY status", ()
            )
    assert dict(rows) == {"ok": 6, "skipped": 4} and len(a.requests()) == 6


async def test_cli_exit_codes(tmp_path, env):
    """`lanes canary run` exits 0 when stable, 1 once the fake drifts; pin and report behave."""
    async with open_fake("a", models=("m",)) as a:
        (tmp_path / "lanes.toml").write_text(
            f'state = "{tmp_path / "c.db"}"\n[[lanes]]\nname = "a"\nmodule = "openai_compatible"\n'
            f'base_url = "{a.base_url}"\napi_key_env = ""\n'
            'free_tier = { kind = "rate_limited" }\n'
            '[[lanes.models]]\nid = "m"\n'
        )
        (tmp_path / "canary.toml").write_text(
            '[[prompts]]\nid = "p"\nmessages = [{ role = "user", content = "pangram" }]\n'
            'checks = { contains = ["quick brown fox"] }\n'
        )

        def canary(*argv: str) -> subprocess.CompletedProcess[str]:
            files = [
                "--config",
                str(tmp_path / "lanes.toml"),
                "--canary",
                str(tmp_path / "canary.toml"),
            ]
            return lanes_command("canary", *argv, *files)

        first = await trio.to_thread.run_sync(canary, "run")
        pinned = await trio.to_thread.run_sync(canary, "pin")
        a.script("m", answer(text=DRIFTED))
        drifted = await trio.to_thread.run_sync(canary, "run", "--json")
        again = await trio.to_thread.run_sync(
            canary, "report", "--md", str(tmp_path / "nightly.md")
        )
        bad = await trio.to_thread.run_sync(lanes_command, "canary", "fly")
    assert first.returncode == 0, first.stderr
    assert "pinned 1 model(s): a/m" in pinned.stdout
    assert (
        drifted.returncode == 1
        and json.loads(drifted.stdout)["models"]["a/m"]["verdict"] == "drifted"
    )
    assert again.returncode == 1 and "drifted" in (tmp_path / "nightly.md").read_text()
    assert bad.returncode == 2


# -- a canary that does not cry wolf ------------------------------------------------------------


async def test_a_rate_limited_model_is_skipped_never_quarantined(env, tmp_path, autojump_clock):
    """A run whose probes meet 429s marks the model skipped — never failed — and quarantines
    nothing, so routing keeps using it."""
    async with open_fake("a", models=("m",)) as a:
        a.script("m", rate_limited(retry_after=600))
        cfg = config(free_lane("a", a.base_url, models=["m"]), state=str(tmp_path / "s.db"))
        async with lanes.open_dispatcher(cfg, env=env) as d:
            await run_canary(d, PROMPTS)
            reports = report(d.store, PROMPTS)
            quarantined = d.store.quarantined()
    assert [(r.key, r.verdict) for r in reports] == [("a/m", "skipped")]
    assert quarantined == {} and len(a.requests()) >= 1


async def test_a_snapshot_past_its_reset_is_not_believed(env, tmp_path, autojump_clock):
    """ "0 left" reported a minute ago, with a 30 s reset, no longer skips the model's probes."""
    headers = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "30s"}
    async with open_fake("a", models=("m",)) as a:
        a.script("m", answer(headers=headers), answer())
        cfg = config(free_lane("a", a.base_url, models=["m"]), state=str(tmp_path / "s.db"))
        async with lanes.open_dispatcher(cfg, env=env) as d:
            await d.complete(lanes.Job(messages=[{"role": "user", "content": "x"}], model="a/m"))
            assert d.statistics().model("a/m").requests_remaining == 0
            await trio.sleep(61)
            assert d.statistics().model("a/m").requests_remaining is None
            await run_canary(d, PROMPTS)
            statuses = sqlite_store(d).records.query(
                "SELECT DISTINCT status FROM canary_answer", ()
            )
    assert statuses == [("ok",)]


async def test_release_and_pin_release_and_report_only_reads(env, tmp_path, autojump_clock):
    """`release` and `pin --model` take a model out of quarantine (pin even with nothing to pin);
    `report` changes no quarantine."""
    async with open_fake("a", models=("m",)) as a:
        cfg = config(free_lane("a", a.base_url, models=["m"]), state=str(tmp_path / "s.db"))
        async with lanes.open_dispatcher(cfg, env=env) as d:
            store = d.store
            store.set_quarantine("a/m", "drifted", "drift 0.9")
            assert release(store, ["a/m", "a/other"]) == {"a/m": True, "a/other": False}
            assert store.quarantined() == {}
            store.set_quarantine("a/m", "failed", "checks fail")
            assert pin(store, keys=["a/m"]) == [] and store.quarantined() == {}
            a.script("m", answer(text="nothing like the baseline at all, not even close"))
            await run_canary(d, PROMPTS)
            pin(d.store)
            a.script("m", answer(text=DRIFTED))
            await run_canary(d, PROMPTS)
            assert "a/m" in store.quarantined()  # the run quarantines
            release(store, ["a/m"])
            reports = report(store, PROMPTS)
            assert reports[0].verdict == "drifted" and store.quarantined() == {}  # report reads


async def test_a_quarantined_model_says_so_in_errors_and_state(env, tmp_path, autojump_clock):
    """A job for a quarantined model fails naming the quarantine (not "free capacity is exhausted"),
    and /v1/lanes marks the model quarantined."""
    from lanes._http.state import lanes_state

    async with open_fake("a", models=("m",)) as a:
        cfg = config(free_lane("a", a.base_url, models=["m"]), state=str(tmp_path / "s.db"))
        async with lanes.open_dispatcher(cfg, env=env) as d:
            d.store.set_quarantine("a/m", "drifted", "drift 0.9")
            d.quarantine(d.store.quarantined())
            with pytest.raises(lanes.JobFailed) as caught:
                await d.complete(
                    lanes.Job(messages=[{"role": "user", "content": "x"}], model="a/m")
                )
            state = lanes_state(d.statistics(), trio.current_time())
    assert not isinstance(caught.value, lanes.FreeTierExhausted)
    assert "a/m: quarantined by the canary (drifted: drift 0.9)" in str(caught.value)
    assert state["lanes"][0]["models"][0]["quarantined"].startswith("quarantined by the canary")
    assert len(a.requests()) == 0


def test_progress_is_plain_lines_off_a_terminal():
    """Progress rewrites one line on a terminal; elsewhere it prints plain lines, no \\r."""
    import io

    from lanes.canary.commands import progress_printer

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    plain, tty = io.StringIO(), Terminal()
    for out in (plain, tty):
        progress = progress_printer(out)
        for done in range(1, 41):
            progress(done, 40)
    assert "\r" not in plain.getvalue() and plain.getvalue().splitlines() == [
        f"canary: {n}/40 probes" for n in (10, 20, 30, 40)
    ]
    assert tty.getvalue().count("\r") == 40 and tty.getvalue().endswith("40/40 probes\n")


async def test_a_local_lane_is_probed_and_what_is_skipped_is_said(tmp_path):
    """`lanes canary run --lane local` probes the local model (it was skipped: only `free` was
    probed); a lane not in the config, or a paid one, is said skipped with why, and a run that
    probed nothing says so and exits 1 — never "no canary run yet" and 0."""
    async with open_fake("local", models=("m",)) as local, open_fake("paid", models=("p",)) as paid:
        (tmp_path / "lanes.toml").write_text(
            f'state = "{tmp_path / "c.db"}"\n'
            f'[[lanes]]\nname = "local"\nmodule = "ollama"\nbase_url = "{local.base_url}"\n'
            '[[lanes.models]]\nid = "m"\n'
            f'[[lanes]]\nname = "paid"\nmodule = "openai_compatible"\n'
            f'base_url = "{paid.base_url}"\napi_key_env = ""\n'
            'free_tier = { kind = "none" }\n'
            '[[lanes.models]]\nid = "p"\ninput_usd_per_mtok = 1\noutput_usd_per_mtok = 1\n'
        )
        (tmp_path / "canary.toml").write_text(
            '[[prompts]]\nid = "p"\nmessages = [{ role = "user", content = "pangram" }]\n'
            'checks = { contains = ["quick brown fox"] }\n'
        )

        def canary(*argv: str) -> subprocess.CompletedProcess[str]:
            files = [
                "--config",
                str(tmp_path / "lanes.toml"),
                "--canary",
                str(tmp_path / "canary.toml"),
            ]
            return lanes_command("canary", *argv, *files)

        probed = await trio.to_thread.run_sync(canary, "run", "--lane", "local", "--json")
        told = await trio.to_thread.run_sync(canary, "run", "--lane", "llamacpp", "--lane", "paid")
        requests = len(local.requests()), len(paid.requests())
    assert probed.returncode == 0, probed.stderr
    assert json.loads(probed.stdout)["models"]["local/m"]["verdict"] == "ok"
    assert requests == (1, 0)
    assert told.returncode == 1
    assert "skipped llamacpp: no lane of that name in the config" in told.stderr
    assert "skipped paid/p: a paid model: the canary never spends money" in told.stderr
    assert "probed nothing of llamacpp, paid" in told.stderr
