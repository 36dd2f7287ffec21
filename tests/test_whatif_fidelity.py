"""`lanes whatif` measures itself: the config that served a window replayed against its own audit
gives a figure, printed, with a warning when it misses; `--faults` replays an outage for as long as
the audit shows it (a lane down the whole window, part of it, not at all); a lane whose key is not
set here is not counted as serving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import lanes
from helpers import audit_of, lanes_command
from lanes._whatif.recorded import read_window

T = 1_780_000_000.0  # the window's start (epoch seconds)
STEP = 60.0  # a job a minute
LOCAL = "llama3.2:3b"

CONFIG = f"""
[policy]
free_tier_fallback = "off"

[[lanes]]
name = "ollama"
models = [{{ id = "{LOCAL}", context = 8192 }}]
"""

GROQ_ONLY = """
[policy]
free_tier_fallback = "off"

[[lanes]]
name = "groq"
models = [{ id = "llama-3.1-8b-instant", context = 8192 }]
"""


def _files(tmp_path: Path, jobs: list[str], config: str = CONFIG) -> tuple[Path, Path]:
    toml = tmp_path / "lanes.toml"
    toml.write_text(config)
    return toml, audit_of(tmp_path / "lanes.db", jobs, start=T, step=STEP)


def _run(config: Path, audit: Path, jobs: int, **kw: Any) -> lanes.WhatIf:
    return lanes.whatif(
        config, audit, since=T, until=T + STEP * (jobs + 2), against=config, environ={}, **kw
    )


DOWN = ["refused", "refused", "skipped", "skipped", "refused", "skipped"]
PART = ["ok", "ok", "ok", "refused", "refused", "skipped", "ok", "ok", "ok"]
UP = ["ok"] * 6


def test_a_lane_down_the_whole_window_is_down_for_all_of_it_with_faults(tmp_path: Path) -> None:
    """Every connection refused (some jobs never reached the lane: breaker open): `--faults`
    replays none served, and the fidelity check holds."""
    config, audit = _files(tmp_path, DOWN)
    result = _run(config, audit, len(DOWN), faults=True)
    assert result.recorded.free == 0
    assert result.new.free == 0, result.new
    assert result.fidelity is not None and result.fidelity.within
    assert result.fidelity.miss == 0.0
    assert result.warnings == ()


def test_a_lane_down_the_whole_window_without_faults_warns_with_the_figure(
    tmp_path: Path,
) -> None:
    """Without `--faults` the replay serves every job: the fidelity check says it misses by 100
    points and that the window's failures were left out."""
    config, audit = _files(tmp_path, DOWN)
    result = _run(config, audit, len(DOWN))
    assert result.new.free == len(DOWN)
    assert result.fidelity is not None and not result.fidelity.within
    assert result.fidelity.miss == pytest.approx(1.0)
    said = "\n".join(result.warnings)
    assert "misses its own audit by 100.0 points" in said
    assert "3 failed attempts the replay leaves out" in said
    assert "ollama: 3 refused connections" in said
    assert any("0.0 % was recorded" in n and "MISSES" in n for n in result.notes)


def test_a_lane_down_for_part_of_the_window_is_down_for_that_part(tmp_path: Path) -> None:
    """Down from its first refusal to its next answer (a job the breaker kept away included):
    `--faults` replays exactly the jobs recorded."""
    config, audit = _files(tmp_path, PART)
    window = read_window(audit, T, T + STEP * 20)
    (outage,) = window.faults
    assert (outage.at, outage.until) == (T + 4 * STEP, T + 7 * STEP)
    result = _run(config, audit, len(PART), faults=True)
    assert result.recorded.free == 6
    assert result.new.free == 6, result.new
    assert result.fidelity is not None and result.fidelity.miss == 0.0
    assert result.warnings == ()


def test_a_lane_never_down_replays_the_same_with_or_without_faults(tmp_path: Path) -> None:
    """No failure recorded: no outage, no warning, and a fidelity figure of 0 points."""
    config, audit = _files(tmp_path, UP)
    assert read_window(audit, T, T + STEP * 20).faults == ()
    for faults in (False, True):
        result = _run(config, audit, len(UP), faults=faults)
        assert result.new.free == result.recorded.free == len(UP)
        assert result.fidelity is not None and result.fidelity.miss == 0.0
        assert result.warnings == ()
        assert any("fidelity:" in n and "within 0.0 points" in n for n in result.notes)


def test_without_the_serving_config_the_fidelity_is_said_unmeasured(tmp_path: Path) -> None:
    """No `against` and no word that `config` served the window: no figure is claimed."""
    config, audit = _files(tmp_path, UP)
    result = lanes.whatif(config, audit, since=T, until=T + STEP * 10, environ={})
    assert result.fidelity is None
    assert any(n.startswith("fidelity not measured") for n in result.notes)
    served = lanes.whatif(config, audit, since=T, until=T + STEP * 10, environ={}, served=True)
    assert served.fidelity is not None and served.fidelity.label == "lanes.toml"


def test_a_lane_whose_key_is_not_set_here_is_not_counted_as_serving(tmp_path: Path) -> None:
    """A config of groq alone, GROQ_API_KEY unset: nothing served free, the note says why; with
    the key set, groq serves every job."""
    config, audit = _files(tmp_path, UP)
    new = tmp_path / "groq.toml"
    new.write_text(GROQ_ONLY)
    unset = lanes.whatif(new, audit, since=T, until=T + STEP * 10, against=config, environ={})
    assert unset.new.by_lane.get("groq", 0) == 0 == unset.new.free
    assert any("groq is not counted as serving: $GROQ_API_KEY is not set" in n for n in unset.notes)
    keyed = lanes.whatif(
        new, audit, since=T, until=T + STEP * 10, against=config, environ={"GROQ_API_KEY": "k"}
    )
    assert keyed.new.by_lane.get("groq", 0) == len(UP)
    assert not any("not counted as serving" in n for n in keyed.notes)


def test_the_command_prints_the_measured_figure_not_a_fixed_sentence(tmp_path: Path) -> None:
    """`lanes whatif` prints the fidelity it measured, and the warnings, as lines."""
    config, audit = _files(tmp_path, DOWN)
    common = ["whatif", "--config", str(config), "--against", str(config), "--audit", str(audit),
              "--since", str(T), "--until", str(T + STEP * 10)]  # fmt: skip
    plain = lanes_command(*common)
    assert plain.returncode == 0, plain.stderr
    assert "reproduces its free share within" not in plain.stdout
    assert "100.0 % free where 0.0 % was recorded: MISSES 100.0 points" in plain.stdout
    assert "warning: the window had 3 failed attempts" in plain.stdout
    faulty = lanes_command(*common, "--faults")
    assert "0.0 % free where 0.0 % was recorded: within 0.0 points" in faulty.stdout
    assert "warning:" not in faulty.stdout
