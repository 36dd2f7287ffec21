"""`lanes whatif` and `lanes.whatif`: the audit of simulated traffic (the providers of `lanes serve
--simulate`, over real loopback sockets, on a virtual clock) replayed under its own config, a config
with a free lane removed, one with a lane added and one with a lower ceiling — and the oracle's
bound, which no replay may exceed."""

from __future__ import annotations

import calendar
import copy
import datetime as dt
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import lanes
from helpers import examples, lanes_command
from lanes._core.open import open_over
from lanes._whatif import TOLERANCE
from lanes._whatif.oracle import Need, ScopeLimits, bound
from lanes._whatif.providers import Limits, Quotas
from lanes._whatif.recorded import read_window
from lanes.harness.processes import dump_toml
from lanes.testing.simulate import open_simulation

#: A day of traffic: quiet hours, and bursts the free quotas can not hold.
DAY = 86400.0
MARK = "PROMPT-MARK-7f3a"  # in every recorded prompt: never in anything the replay writes


def _midnight() -> float:
    return float(calendar.timegm((dt.date.today() - dt.timedelta(days=2)).timetuple()))


def _arrivals(seed: int = 5) -> list[tuple[float, str, bool]]:
    rng = random.Random(seed)
    times: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(1 / 400.0)
        if t >= DAY - 120:
            break
        times.append(t)
    for start in (3 * 3600.0, 11 * 3600.0, 17 * 3600.0):  # three bursts of 120 jobs in 2 minutes
        times += [start + rng.uniform(0, 120) for _ in range(120)]
    models = ["fast", "fast", "fast", "auto"]
    return sorted((t, rng.choice(models), rng.random() < 0.25) for t in times)


async def _record(state: Path, midnight: float) -> dict[str, Any]:
    async with open_simulation({}, state=str(state), fallback="allow", flap=False) as sim:
        config = copy.deepcopy(sim.config)
        loaded = lanes.load_config(config, env=sim.env)
        # a simulated day: the state sync every virtual minute, not every half second (172,800
        # rounds of SQLite writes on the virtual clock were most of this test's time)
        async with open_over(loaded, env=sim.env, epoch_now=midnight, sync_interval_s=60.0) as d:
            t0 = trio.current_time()

            async def one(model: str, streamed: bool, n: int) -> None:
                job = lanes.Job(
                    messages=[{"role": "user", "content": f"{MARK} question {n} " + "w" * 200}],
                    model=model,
                    params={"max_tokens": 64},
                    deadline_s=20,
                )
                try:
                    if streamed:
                        async with d.open_stream(job) as stream:
                            async for _ in stream:
                                pass
                    else:
                        await d.complete(job)
                except lanes.JobFailed:
                    pass

            async with trio.open_nursery() as nursery:
                for n, (at, model, streamed) in enumerate(_arrivals()):
                    await trio.sleep_until(t0 + at)
                    nursery.start_soon(one, model, streamed, n)
            await trio.sleep(65)  # the last rows reach the file at the next sync
        return config


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The audit of a simulated day in a real SQLite file, and the config that served it."""
    base = tmp_path_factory.mktemp("whatif")
    state = base / "lanes.db"
    midnight = _midnight()
    config = trio.run(_record, state, midnight, clock=trio.testing.MockClock(autojump_threshold=0))
    for lane in config["lanes"]:  # the replay never calls them: anything will do
        lane["base_url"] = f"http://{lane['name']}.example/v1"
        # the simulation's keys are not set here: a lane whose key is not set is off in a replay
        lane["api_key_env"] = ""
    config["state"] = str(state)
    current = base / "current.toml"
    current.write_text(dump_toml(config))
    return {"state": state, "config": config, "current": current, "since": midnight, "base": base}


def _variant(recorded: dict[str, Any], name: str, change: Any) -> Path:
    config = copy.deepcopy(recorded["config"])
    change(config)
    path = recorded["base"] / f"{name}.toml"
    path.write_text(dump_toml(config))
    return path


def _whatif(recorded: dict[str, Any], config: Path, **kw: Any) -> lanes.WhatIf:
    return lanes.whatif(
        config,
        recorded["state"],
        since=recorded["since"],
        until=recorded["since"] + DAY,
        **kw,
    )


def test_the_audit_keeps_what_a_replay_needs_and_no_prompt(recorded: dict[str, Any]) -> None:
    window = read_window(recorded["state"], recorded["since"], recorded["since"] + DAY)
    assert len(window.jobs) == len(_arrivals())
    assert window.older_rows == 0
    assert {j.asked for j in window.jobs} == {"fast", "auto"}
    assert sum(j.streamed for j in window.jobs) > 20
    assert all(j.max_tokens == 64 and j.deadline_s == pytest.approx(20) for j in window.jobs)
    assert all(j.prompt_tokens > 50 for j in window.jobs if j.outcome == "ok")
    assert MARK.encode() not in recorded["state"].read_bytes()


def test_the_unchanged_config_replays_what_was_recorded(recorded: dict[str, Any]) -> None:
    result = _whatif(recorded, recorded["current"])
    was, now = result.recorded, result.new
    assert was.jobs == now.jobs == len(_arrivals())
    assert was.free_share is not None and now.free_share is not None
    assert abs(now.free_share - was.free_share) <= TOLERANCE, (was, now)
    for lane in set(was.by_lane) | set(now.by_lane):  # each lane's share of the jobs, too
        assert abs(was.by_lane.get(lane, 0) - now.by_lane.get(lane, 0)) <= TOLERANCE * was.jobs
    assert was.paid_jobs > 0  # the bursts did spill to paid: the test has teeth
    assert now.oracle_free is not None and now.oracle_free >= now.free


def test_removing_a_free_lane_moves_jobs_to_paid(recorded: dict[str, Any]) -> None:
    def without_groq(config: dict[str, Any]) -> None:
        config["lanes"] = [lane for lane in config["lanes"] if lane["name"] != "groq"]
        config["aliases"] = {
            k: [c for c in v if not c.startswith("groq/")] for k, v in config["aliases"].items()
        }

    result = _whatif(
        recorded, _variant(recorded, "no-groq", without_groq), against=recorded["current"]
    )
    assert result.against is not None
    before, after = result.against, result.new
    assert after.by_lane.get("groq", 0) == 0 < before.by_lane["groq"]
    assert after.free < before.free
    assert after.paid_jobs > before.paid_jobs and after.paid_usd > before.paid_usd
    for figures in (before, after):
        assert figures.oracle_free is not None and figures.oracle_free >= figures.free


def test_adding_a_lane_keeps_more_free(recorded: dict[str, Any]) -> None:
    def with_cerebras(config: dict[str, Any]) -> None:
        config["lanes"].insert(
            2,
            {
                "name": "cerebras",
                "module": "openai_compatible",
                "base_url": "http://cerebras.example/v1",
                "api_key_env": "",
                "free_tier": {"kind": "rate_limited", "rpm": 30, "rpd": 14400},
                "models": [{"id": "llama-3.3-70b", "context": 65536}],
            },
        )
        config["aliases"]["fast"].insert(1, "cerebras/llama-3.3-70b")

    result = _whatif(
        recorded, _variant(recorded, "cerebras", with_cerebras), against=recorded["current"]
    )
    assert result.against is not None
    assert result.new.by_lane.get("cerebras", 0) > 0
    assert result.new.free > result.against.free
    assert result.new.paid_usd < result.against.paid_usd
    assert result.new.oracle_free is not None and result.new.oracle_free >= result.new.free


def test_a_lower_ceiling_is_reached_and_said_when(recorded: dict[str, Any]) -> None:
    def lower(config: dict[str, Any]) -> None:
        config["policy"]["paid_ceiling_usd_per_day"] = 0.00003

    result = _whatif(
        recorded, _variant(recorded, "low-ceiling", lower), against=recorded["current"]
    )
    day = result.new.days[0]
    assert day.ceiling_usd == 0.00003
    assert day.spent_usd <= 0.00003 + 1e-12  # the ceiling held in the replay
    assert day.reached_at is not None and day.reached_at.startswith(day.day)
    assert result.new.failed.get("paid_budget_exhausted", 0) > 0
    assert result.against is not None and result.against.days[0].reached_at is None


def test_the_command_prints_both_configs_and_gates_ci(recorded: dict[str, Any]) -> None:
    def lower(config: dict[str, Any]) -> None:
        config["policy"]["paid_ceiling_usd_per_day"] = 0.00003

    new = _variant(recorded, "cli-low", lower)
    md = recorded["base"] / "whatif.md"
    audit_before = hashlib.sha256(recorded["state"].read_bytes()).hexdigest()

    def files() -> list[str]:  # SQLite's own -wal and -shm beside the audit aside (a reader's)
        return sorted(p.name for p in recorded["base"].iterdir() if "lanes.db-" not in p.name)

    files_before = files()
    common = [
        "whatif", "--config", str(new),
        "--against", str(recorded["current"]), "--audit", str(recorded["state"]),
        "--since", str(recorded["since"]), "--until", str(recorded["since"] + DAY),
    ]  # fmt: skip
    shown = lanes_command(*common, "--md", str(md), "--fail-if-spend-above", "100")
    assert shown.returncode == 0, shown.stderr  # a gate that holds passes
    for expected in ("recorded", "current.toml", "cli-low.toml", "free share", "oracle",
                     "ceiling at", "paid_budget_exhausted"):  # fmt: skip
        assert expected in shown.stdout, expected
    assert md.read_text().startswith("| ")
    as_json = lanes_command(*common, "--json", "--fail-if-free-share-below", "0.99")
    assert as_json.returncode == 1
    data = json.loads(as_json.stdout)
    assert data["new"]["days"][0]["reached_at"] is not None
    assert "free share" in as_json.stderr
    # nothing of a prompt in what it printed or wrote; the audit untouched; no state file opened
    for out in (shown.stdout, shown.stderr, as_json.stdout, md.read_text()):
        assert MARK not in out and "question" not in out and "www" not in out
    assert hashlib.sha256(recorded["state"].read_bytes()).hexdigest() == audit_before
    assert files() == sorted({*files_before, "whatif.md"})


def test_faults_replay_the_recorded_failures(recorded: dict[str, Any], tmp_path: Path) -> None:
    """With `--faults`, a lane whose attempts the audit shows failing fails again then."""
    import sqlite3

    copy_of = tmp_path / "faulty.db"
    copy_of.write_bytes(recorded["state"].read_bytes())
    conn = sqlite3.connect(copy_of)
    jobs = conn.execute(
        "SELECT job, at FROM audit WHERE lane = 'groq' AND outcome = 'ok' ORDER BY at"
    ).fetchall()
    assert len(jobs) > 10
    with conn:  # the audit says groq refused connections around each of those jobs
        conn.executemany(
            "INSERT INTO audit_attempt (job, n, at, lane, model, tier, route, outcome, category) "
            "VALUES (?, 99, ?, 'groq', 'llama-3.1-8b-instant', 'free', 'primary', 'fault', "
            "'connect')",
            jobs,
        )
    conn.close()
    plain = lanes.whatif(
        recorded["current"], copy_of, since=recorded["since"], until=recorded["since"] + DAY
    )
    faulty = lanes.whatif(
        recorded["current"],
        copy_of,
        since=recorded["since"],
        until=recorded["since"] + DAY,
        faults=True,
    )
    assert faulty.new.by_lane.get("groq", 0) < plain.new.by_lane["groq"] / 2


# -- the oracle --------------------------------------------------------------------------------


def _brute(needs: list[Need], limits: dict[str, ScopeLimits]) -> int:
    """The most servable, by trying every assignment (tiny cases only)."""
    options = []
    for need in needs:
        first, last = int(need.arrived // 60), int((need.arrived + need.deadline_s) // 60)
        options.append(
            [None] + [(s, m) for s in sorted(need.scopes) for m in range(first, last + 1)]
        )
    best = 0

    def go(
        i: int, used: dict[tuple[str, int], int], day: dict[tuple[str, int], int], n: int
    ) -> None:
        nonlocal best
        if i == len(needs):
            best = max(best, n)
            return
        if n + (len(needs) - i) <= best:
            return
        for option in options[i]:
            if option is None:
                go(i + 1, used, day, n)
                continue
            scope, minute = option
            lim = limits[scope]
            d = (scope, minute // 1440)
            if (lim.rpm is None or used.get(option, 0) < lim.rpm) and (
                lim.rpd is None or day.get(d, 0) < lim.rpd
            ):
                used[option] = used.get(option, 0) + 1
                day[d] = day.get(d, 0) + 1
                go(i + 1, used, day, n + 1)
                used[option] -= 1
                day[d] -= 1

    go(0, {}, {}, 0)
    return best


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 300), st.sampled_from([0.0, 30.0, 90.0]), st.sets(st.sampled_from("ab"))
        ),
        max_size=7,
    ),
    st.integers(1, 3),
    st.integers(1, 5),
)
def test_the_oracle_is_the_exact_maximum(jobs: list[Any], rpm: int, rpd: int) -> None:
    needs = [
        Need(arrived=a, deadline_s=d, scopes=frozenset(s), unlimited=False) for a, d, s in jobs
    ]
    limits = {"a": ScopeLimits(rpm=rpm, rpd=rpd), "b": ScopeLimits(rpm=1, rpd=None)}
    assert bound(needs, limits) == _brute(needs, limits)


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.floats(0, 86400 * 2), max_size=200), st.integers(1, 20), st.integers(1, 100))
def test_the_oracle_never_falls_below_the_quota_a_provider_enforces(
    times: list[float], rpm: int, rpd: int
) -> None:
    """A greedy server taking every job the replay's quota counter admits serves no more than the
    bound (the same counter the replay's providers use)."""
    quotas, served = Quotas(), 0
    for t in sorted(times):
        if quotas.admit("a", Limits(rpm=rpm, rpd=rpd), t, 0) is None:
            served += 1
    needs = [Need(arrived=t, deadline_s=0.0, scopes=frozenset("a"), unlimited=False) for t in times]
    assert served <= bound(needs, {"a": ScopeLimits(rpm=rpm, rpd=rpd)})


def test_jobs_a_config_can_not_serve_fail_and_say_why(recorded: dict[str, Any]) -> None:
    def without_fast(config: dict[str, Any]) -> None:
        del config["aliases"]["fast"]

    result = _whatif(recorded, _variant(recorded, "no-fast", without_fast))
    asked_fast = sum(1 for _, model, _ in _arrivals() if model == "fast")
    assert result.new.failed.get("model_not_found") == asked_fast
    assert result.new.jobs == len(_arrivals())


def test_a_file_that_is_no_audit_is_a_clear_error(recorded: dict[str, Any], tmp_path: Path) -> None:
    bogus = tmp_path / "not-an-audit.db"
    bogus.write_bytes(b"this is not SQLite" * 100)
    done = lanes_command(
        "whatif", "--config", str(recorded["current"]), "--audit", str(bogus), "--since", "1d"
    )
    assert done.returncode == 2
    assert "not an audit" in done.stderr and "Traceback" not in done.stderr


# -- hostile audits ----------------------------------------------------------------------------


def _audit_file(path: Path, rows: list[dict[str, Any]]) -> Path:
    """An audit table holding `rows` as given (any type in any column), as a hand-edited file."""
    import sqlite3

    from lanes._core.state.audit_tables import AUDIT_COLUMNS

    conn = sqlite3.connect(path)
    with conn:
        conn.execute(f"CREATE TABLE audit ({', '.join(AUDIT_COLUMNS)})")
        for row in rows:
            names = ", ".join(f'"{k}"' for k in row)
            marks = ", ".join("?" for _ in row)
            conn.execute(f"INSERT INTO audit ({names}) VALUES ({marks})", list(row.values()))
    conn.close()
    return path


_T = 1_780_000_000.0
_ROW: dict[str, Any] = {
    "at": _T + 10, "latency_s": 1.0, "asked": "fast", "outcome": "ok", "route": "primary",
    "lane": "groq", "model": "m", "tier": "free", "cost_usd": 0.0, "prompt_tokens": 10,
    "completion_tokens": 5, "deadline_s": 20.0, "max_tokens": 64,
}  # fmt: skip


def test_infinite_numbers_in_an_audit_row_are_read_as_missing(tmp_path: Path) -> None:
    """SQLite's infinity in a numeric column is no deadline, latency or cost."""
    inf = float("inf")
    path = _audit_file(
        tmp_path / "a.db", [_ROW | {"deadline_s": inf, "latency_s": inf, "cost_usd": inf}]
    )
    (job,) = read_window(path, _T, _T + 100).jobs
    assert (job.deadline_s, job.latency_s, job.cost_usd) == (None, 0.0, 0.0)
    assert job.arrived == _T + 10


@pytest.mark.parametrize("flag", [["--since", "nan"], ["--since", "1e400"], ["--until", "nan"]])
def test_a_time_no_calendar_holds_is_a_clear_error(tmp_path: Path, flag: list[str]) -> None:
    """--since or --until nan, inf or 1e400: exit 2 and one line, no traceback."""
    path = _audit_file(tmp_path / "a.db", [_ROW])
    config = tmp_path / "c.toml"
    config.write_text('[[lanes]]\nname = "ollama"\n')
    done = lanes_command(
        "whatif", "--config", str(config), "--audit", str(path), "--since", str(_T), *flag
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and f"{flag[0]} must be" in done.stderr


def test_odd_lane_names_from_the_audit_can_not_break_the_table() -> None:
    """A recorded lane name holding a newline, an escape or a pipe stays in its one cell."""
    from lanes._whatif.figures import markdown, summarise, table, text

    odd = "a|b\nc\x1b[2J\\"
    rows = [{"at": _T, "outcome": "ok", "route": "primary", "lane": odd, "tier": "free"}]
    shown = table([summarise("x|y.toml", rows, ceiling_usd=1.0)])
    printed = text(shown)
    assert "\x1b" not in printed and len(printed.splitlines()) == len(shown)
    md = markdown(shown).splitlines()
    assert len(md) == len(shown) + 1
    assert all(line.count("|") - line.count("\\|") == 3 for line in md if not line.startswith("|-"))


def _direct(needs: list[Need], limits: dict[str, ScopeLimits]) -> int:
    """The bound's network with an edge from each job to each minute it may be sent in."""
    from lanes._whatif.oracle import INFINITE, _Graph

    graph = _Graph()
    source, sink = graph.node(), graph.node()
    nodes: dict[tuple[str, int, str], int] = {}

    def node(scope: str, n: int, kind: str) -> int:
        if (scope, n, kind) not in nodes:
            nodes[(scope, n, kind)] = graph.node()
            cap = limits[scope].rpd if kind == "d" else limits[scope].rpm
            out = sink if kind == "d" else node(scope, n // 1440, "d")
            graph.edge(nodes[(scope, n, kind)], out, INFINITE if cap is None else cap)
        return nodes[(scope, n, kind)]

    for need in needs:
        job = graph.node()
        graph.edge(source, job, 1)
        for scope in sorted(need.scopes):
            first = int(need.arrived // 60)
            for minute in range(first, int((need.arrived + need.deadline_s) // 60) + 1):
                graph.edge(job, node(scope, minute, "m"), 1)
    return int(graph.max_flow(source, sink))


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 86400 * 2),
            st.sampled_from([0.0, 90.0, 3600.0, 86400.0]),
            st.sets(st.sampled_from("ab"), min_size=1),
        ),
        max_size=40,
    ),
    st.integers(1, 3),
    st.integers(1, 30),
)
def test_the_oracle_over_long_windows_is_the_direct_networks_flow(
    jobs: list[Any], rpm: int, rpd: int
) -> None:
    """Windows of an hour or a day, reached through blocks of minutes, give the same maximum."""
    needs = [
        Need(arrived=a, deadline_s=d, scopes=frozenset(s), unlimited=False) for a, d, s in jobs
    ]
    limits = {"a": ScopeLimits(rpm=rpm, rpd=rpd), "b": ScopeLimits(rpm=1, rpd=None)}
    assert bound(needs, limits) == _direct(needs, limits)


def test_the_oracle_stays_small_for_jobs_that_may_wait_a_day_or_forever() -> None:
    """Day-long deadlines build no minute edges per job (blocks of minutes instead: the bound of a
    week of them stays small); longer (or infinite) ones count free."""
    rng = random.Random(3)
    week = [rng.uniform(0, 7 * DAY) for _ in range(5000)]
    needs = [Need(arrived=t, deadline_s=DAY, scopes=frozenset("a"), unlimited=False) for t in week]
    assert bound(needs, {"a": ScopeLimits(rpm=1, rpd=100)}) == 800  # 7 days' arrivals, 8 days
    forever = [Need(arrived=0.0, deadline_s=d, scopes=frozenset("a"), unlimited=False)
               for d in (float("inf"), float("nan"), 2 * DAY)]  # fmt: skip
    assert bound(forever, {"a": ScopeLimits(rpm=1, rpd=1)}) == 3


def test_the_oracle_gives_a_job_without_a_deadline_the_configs_default() -> None:
    """An older row keeps no deadline: the replay waits the config's default, so may the bound."""
    from lanes._whatif import oracle_of
    from lanes._whatif.providers import SimLane
    from lanes._whatif.recorded import Recorded
    from lanes._whatif.replay import Replayed

    shape = dict(_ROW, arrived=_T - _T % 60, client="c", cohort="", request_class="general",
                 privacy="any", embedding=False, streamed=False, deadline_s=None,
                 approval="")  # fmt: skip
    del shape["at"]
    jobs = [Recorded(**shape) for _ in range(3)]
    lane = SimLane(name="g", kind="rate_limited", limits=Limits(rpm=1), models=("m",))
    rows = [{"index": i, "outcome": "paid_budget_exhausted", "plan": '["g/m"]'} for i in range(3)]
    run = Replayed(rows=tuple(rows), tiers={"g/m": "free"}, lanes={"g": lane}, unstated=(),
                   refused={}, upstream_requests=0, wall_s=0.0)  # fmt: skip
    assert oracle_of(run, jobs, default_deadline_s=150.0) == 3  # minutes 0, 1 and 2
    assert oracle_of(run, jobs) == 1


def test_text_in_the_flag_columns_is_no_flag(tmp_path: Path) -> None:
    """`embedding = 'no'` in a hand-edited row does not replay a chat as an embedding."""
    path = _audit_file(tmp_path / "a.db", [_ROW | {"embedding": "no", "streamed": "false"}])
    (job,) = read_window(path, _T, _T + 100).jobs
    assert not job.embedding and not job.streamed


def test_a_burst_beyond_the_jobs_in_flight_waits_and_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More jobs at once than `MAX_IN_FLIGHT`: the rest start as room frees up, each replayed and
    counted late — memory stays bounded by the jobs in flight."""
    import importlib

    import bench.whatif

    replay_module = importlib.import_module("lanes._whatif.replay")  # the module, not the function
    from lanes._whatif.recorded import Recorded

    monkeypatch.setattr(replay_module, "MAX_IN_FLIGHT", 2)
    shape = dict(_ROW, arrived=_T, client="anonymous", cohort="", request_class="general",
                 privacy="any", embedding=False, streamed=False, deadline_s=30.0, approval="",
                 asked="chat")  # fmt: skip
    del shape["at"]
    run = replay_module.replay(
        bench.whatif.config(), [Recorded(**shape) for _ in range(5)], since=_T
    )
    assert run.late == 3
    assert sorted(row["index"] for row in run.rows) == [0, 1, 2, 3, 4]
    assert all(row["outcome"] == "ok" for row in run.rows)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--fail-if-free-share-below", "80"),
        ("--fail-if-free-share-below", "nan"),
        ("--fail-if-spend-above", "-1"),
        ("--fail-if-spend-above", "inf"),
    ],
)
def test_a_gate_that_could_never_mean_what_was_meant_is_refused(
    recorded: dict[str, Any], flag: str, value: str
) -> None:
    done = lanes_command(
        "whatif", "--config", str(recorded["current"]), "--audit", str(recorded["state"]),
        flag, value,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert flag in done.stderr and "Traceback" not in done.stderr


def test_a_gate_over_an_empty_window_fails_and_says_why(recorded: dict[str, Any]) -> None:
    done = lanes_command(
        "whatif", "--config", str(recorded["current"]), "--audit", str(recorded["state"]),
        "--since", "1000", "--until", "2000", "--fail-if-spend-above", "1",
    )  # fmt: skip
    assert done.returncode == 1
    assert "no jobs in the window" in done.stderr


def test_an_audit_whose_path_holds_uri_characters_is_read(tmp_path: Path) -> None:
    """`?`, `#` and `%` in the audit's path are part of the name, not of a URI."""
    folder = tmp_path / "odd ?name #1 %41"
    folder.mkdir()
    path = _audit_file(folder / "a?b#c%20.db", [_ROW])
    assert len(read_window(path, _T, _T + 100).jobs) == 1
