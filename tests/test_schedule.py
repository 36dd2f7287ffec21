"""The ways to run lanes for real: the sidecar's unit (docs/systemd/) and the canary's schedule
(canary/: its crontab line and systemd units) are well-formed, hardened and accepted by systemd
where it is installed, and the canary's crontab line works when run the way cron runs it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from lanes.testing import open_fake

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CANARY = ROOT / "canary"
HOMES = {
    "lanes.service": DOCS / "systemd",
    "lanes-canary.service": CANARY / "systemd",
    "lanes-canary.timer": CANARY / "systemd",
}
SYSTEMD = shutil.which("systemd-analyze") or "systemd-analyze"
UNITS = ("lanes.service", "lanes-canary.service", "lanes-canary.timer")


def unit(name: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as section → key → values (systemd keys are case-sensitive and may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in (HOMES[name] / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{name}: not a key=value line: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(section: dict[str, list[str]], key: str) -> str:
    (value,) = section[key]
    return value


def test_systemd_units_parse_and_point_at_each_other():
    """The units parse, the timer names the service, the services run `lanes serve` and
    `lanes canary run`, and the timer states its time zone."""
    service, timer, sidecar = (
        unit("lanes-canary.service"),
        unit("lanes-canary.timer"),
        unit("lanes.service"),
    )
    assert one(service["Service"], "Type") == "oneshot"
    assert "-m lanes canary run" in one(service["Service"], "ExecStart")
    assert "-m lanes serve --config " in one(sidecar["Service"], "ExecStart")
    assert (
        one(timer["Timer"], "Unit") == "lanes-canary.service"
        and one(timer["Install"], "WantedBy") == "timers.target"
    )
    assert re.fullmatch(r"\*-\*-\* \d\d:\d\d:\d\d UTC", one(timer["Timer"], "OnCalendar"))


@pytest.mark.parametrize("name", ["lanes.service", "lanes-canary.service"])
def test_services_are_hardened(name):
    """No root, one writable state directory, a read-only system, no new privileges; keys from an
    environment file, shared state by one user name."""
    service = unit(name)["Service"]
    assert one(service, "DynamicUser") == "yes" and one(service, "User") == "lanes"
    assert one(service, "StateDirectory") == "lanes" and one(service, "ProtectSystem") == "strict"
    assert one(service, "NoNewPrivileges") == "yes" and one(service, "CapabilityBoundingSet") == ""
    assert one(service, "EnvironmentFile") == "-/etc/lanes/keys.env"
    assert one(service, "Environment") == "HOME=%S/lanes"


def runnable_copies(tmp_path: Path) -> list[Path]:
    """The units with their interpreter pointed at one that exists here (verify checks it)."""
    out = []
    for name in UNITS:
        text = (HOMES[name] / name).read_text()
        target = tmp_path / name
        target.write_text(text.replace("/opt/lanes/.venv/bin/python", sys.executable))
        out.append(target)
    return out


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not on this machine"
)
def test_systemd_analyze_verifies_the_units_and_rates_them_safe(tmp_path):
    """Where systemd-analyze exists: `verify` accepts all three units, the calendar parses, and
    `security --offline` rates both services OK (exposure below 2 of 10)."""
    units = runnable_copies(tmp_path)
    verify = subprocess.run(
        [SYSTEMD, "verify", *map(str, units)], capture_output=True, text=True, timeout=60
    )
    assert verify.returncode == 0 and verify.stderr.strip() == "", verify.stderr
    calendar = one(unit("lanes-canary.timer")["Timer"], "OnCalendar")
    assert subprocess.run([SYSTEMD, "calendar", calendar], capture_output=True).returncode == 0
    for path in units[:2]:
        rated = subprocess.run(
            [SYSTEMD, "security", "--offline=true", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        level = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", rated.stdout)
        assert level is not None, rated.stdout + rated.stderr
        assert float(level.group(1)) < 2.0 and level.group(2) == "OK", level.group(0)


def crontab_line() -> str:
    """The one schedule line of `canary/crontab` — the line `canary/README.md` shows, too."""
    (line,) = [
        ln for ln in (CANARY / "crontab").read_text().splitlines() if re.match(r"^[\d*]", ln)
    ]
    assert "lanes canary run" in line
    assert line in (CANARY / "README.md").read_text().splitlines()
    return line


def test_crontab_line():
    """The documented crontab line has five valid time fields, runs the canary, exports the keys
    it reads, and has no `%` (which cron would turn into a newline)."""
    line = crontab_line()
    fields = line.split()[:5]
    ranges = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
    for field, (low, high) in zip(fields, ranges, strict=True):
        assert field == "*" or low <= int(field) <= high, field
    assert "set -a && . /etc/lanes/keys.env && set +a" in line and "%" not in line


@pytest.mark.slow
@pytest.mark.free_lane
async def test_the_crontab_line_runs_under_cron_conditions(tmp_path):
    """The documented line, run as cron runs it — `env -i` with cron's few variables, `/bin/sh -c`
    — with its paths moved into a temporary folder: the key in keys.env reaches the canary, the
    probes go out to the provider that needs it, the report is written, the log holds plain
    progress lines."""
    opt, etc, var = tmp_path / "opt", tmp_path / "etc", tmp_path / "log"
    for folder in (opt, etc, var):
        folder.mkdir()
    (opt / ".venv").symlink_to(Path(sys.executable).parent.parent)  # the project's venv
    (etc / "keys.env").write_text("ACME_CANARY_KEY=sk-cron-test\n")
    command = " ".join(crontab_line().split()[5:])
    command = (
        command.replace("/opt/lanes", str(opt))
        .replace("/etc/lanes", str(etc))
        .replace("/var/log/lanes", str(var))
    )
    async with open_fake("acme", models=("m",)) as fake:
        (etc / "lanes.toml").write_text(
            f'state = "{tmp_path / "state.db"}"\n'
            '[[lanes]]\nname = "acme"\nmodule = "openai_compatible"\n'
            f'base_url = "{fake.base_url}"\napi_key_env = "ACME_CANARY_KEY"\n'
            'free_tier = { kind = "rate_limited" }\n[[lanes.models]]\nid = "m"\n'
        )
        cron_env = ["HOME=" + str(tmp_path), "LOGNAME=cron", "SHELL=/bin/sh", "PATH=/usr/bin:/bin"]
        done = await trio.run_process(
            ["env", "-i", *cron_env, "/bin/sh", "-c", command],
            check=False,
            capture_stdout=True,
            capture_stderr=True,
        )
        sent = [r for r in fake.requests() if r.authorization]
    log = (var / "canary.log").read_text()
    assert done.returncode == 0, log
    assert len(sent) == 10, log  # every pinned prompt reached the provider, with the key
    assert "acme/m" in (var / "canary-nightly.md").read_text()
    assert "\r" not in log and "canary: 10/10 probes" in log
