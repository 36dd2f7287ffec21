"""The nightly schedule shipped in docs/: the systemd units and the crontab line are well-formed."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"


class CaseSensitiveParser(configparser.ConfigParser):
    """systemd keys are case-sensitive (`ExecStart`, `WantedBy`): keep option names as written."""

    def optionxform(self, optionstr: str) -> str:
        return optionstr


def unit(name: str) -> configparser.ConfigParser:
    parser = CaseSensitiveParser(strict=True, interpolation=None)
    parser.read_string((DOCS / "systemd" / name).read_text())
    return parser


def test_systemd_units_parse_and_point_at_each_other():
    """Both units parse, the timer names the service, and the service runs `lanes canary run`."""
    service, timer = unit("lanes-canary.service"), unit("lanes-canary.timer")
    assert service["Service"]["Type"] == "oneshot"
    assert "-m lanes canary run" in service["Service"]["ExecStart"]
    assert (
        timer["Timer"]["Unit"] == "lanes-canary.service"
        and timer["Install"]["WantedBy"] == "timers.target"
    )
    assert re.fullmatch(r"\*-\*-\* \d\d:\d\d:\d\d UTC", timer["Timer"]["OnCalendar"])


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not on this machine"
)
def test_systemd_analyze_accepts_the_calendar():
    """Where systemd-analyze exists, it accepts the timer's calendar expression."""
    calendar = unit("lanes-canary.timer")["Timer"]["OnCalendar"]
    assert (
        subprocess.run(["systemd-analyze", "calendar", calendar], capture_output=True).returncode
        == 0
    )


def test_crontab_line():
    """The documented crontab line has five valid time fields and runs the canary."""
    text = (DOCS / "canary.md").read_text()
    line = next(
        ln for ln in text.splitlines() if re.match(r"^[\d*]", ln) and "lanes canary run" in ln
    )
    fields = line.split()[:5]
    ranges = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
    for field, (low, high) in zip(fields, ranges, strict=True):
        assert field == "*" or low <= int(field) <= high, field
