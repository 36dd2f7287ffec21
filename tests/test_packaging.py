"""The package as a user gets it: the wheel holds the default config, and README's quick start
works from outside the repository with nothing but the installed package."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest

pytestmark = pytest.mark.slow  # builds the wheel and runs it in child processes

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """The wheel built from a copy of the sources and installed into an empty folder; the
    environment that runs it from elsewhere (the project's venv supplies the dependencies)."""
    tmp = tmp_path_factory.mktemp("packaged")
    src = tmp / "src"
    shutil.copytree(ROOT / "lanes", src / "lanes", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp / "dist").glob("lanes_router-*.whl")  # the distribution is lanes-router
    site = tmp / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    work = tmp / "elsewhere"
    work.mkdir()
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp / "home"),
        "PYTHONPATH": str(site),
        "WORK": str(work),
        "SITE": str(site),
    }


def run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        cwd=env["WORK"],
        env={k: v for k, v in env.items() if k not in ("WORK", "SITE")},
        capture_output=True,
        text=True,
        timeout=120,
    )


def start(env: dict[str, str], *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "lanes", *argv],
        cwd=env["WORK"],
        env={k: v for k, v in env.items() if k not in ("WORK", "SITE")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_healthy(process: subprocess.Popen[str], port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[0]
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/health", trust_env=False).status_code == 200:
                return
        except httpx2.TransportError:
            time.sleep(0.1)
    raise AssertionError("the sidecar never answered /health")


def stop(process: subprocess.Popen[str]) -> tuple[int, str]:
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    return process.returncode, out


def test_the_wheel_is_what_runs_and_holds_the_defaults(installed):
    """Outside the repository the installed copy is imported, with its config as package data."""
    done = run(
        installed,
        "-c",
        "import lanes, lanes._core.config.schema as c; print(lanes.__file__); "
        "print(c.packaged('lanes.toml').read_text()[:7])",
    )
    assert done.returncode == 0, done.stderr
    where, head = done.stdout.splitlines()
    assert where.startswith(installed["SITE"]) and head == "# lanes"
    assert run(installed, "-m", "lanes", "--version").stdout.strip() == "lanes 0.1.0"


def test_the_quick_start_works_outside_the_repository(installed):
    """README's install block, command by command: serve --simulate answers README's own OpenAI
    example; init writes a config check-config accepts; serve runs on the packaged default."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```sh\npython3.11 -m venv.*?```", readme, re.S)
    assert block is not None
    commands = [ln.split("#")[0].strip() for ln in block.group(0).splitlines()[1:-1]]
    assert commands[2:] == [
        "lanes serve --simulate",
        "lanes init",
        "lanes check-config lanes.toml",
        "lanes serve --config lanes.toml",
    ]
    port = free_port()
    simulated = start(installed, "serve", "--simulate", "--port", str(port))
    try:
        wait_healthy(simulated, port)
        example = re.search(r"```python\n(from openai import OpenAI.*?)```", readme, re.S)
        assert example is not None
        answered = run(installed, "-c", example.group(1).replace("4098", str(port)))
    finally:
        code, log = stop(simulated)
    assert answered.returncode == 0, answered.stderr
    assert re.match(r"\S+ (local|primary|free_retry|paid_fallback) ", answered.stdout)
    assert code == 0 and "Traceback" not in log
    init = run(installed, "-m", "lanes", "init")
    assert init.returncode == 0 and (Path(installed["WORK"]) / "lanes.toml").exists()
    checked = run(installed, "-m", "lanes", "check-config", "lanes.toml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    port = free_port()
    default = start(installed, "serve", "--port", str(port))  # no --config: the shipped default
    try:
        wait_healthy(default, port)
    finally:
        code, log = stop(default)
    assert code == 0 and "Traceback" not in log
    assert (Path(installed["HOME"]) / ".local/state/lanes/lanes.db").exists()


def test_no_page_tells_a_user_to_install_the_index_s_other_lanes():
    """`lanes` on the public index is somebody else's project: README and the docs name the
    distribution `lanes-router`, and no install line asks for the bare name."""
    pages = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        *(ROOT / "docs").rglob("*.service"),
    ]
    wrong = [
        f"{p.relative_to(ROOT)}: {line.strip()}"
        for p in pages
        for line in p.read_text().splitlines()
        if re.search(r"pip install\s+(-\S+\s+)*['\"]?lanes(\[[^\]]*\])?['\"]?(\s|$)", line)
    ]
    assert wrong == []
    assert 'name = "lanes-router"' in (ROOT / "pyproject.toml").read_text()


def _documentation_url() -> str:
    found = re.search(r'^Documentation = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert found is not None, "pyproject.toml names no Documentation URL"
    return found.group(1)


def test_commands_find_their_inputs_outside_the_repository(installed, tmp_path):
    """From the installed wheel, outside the repository, with no flags: `report`, `explain`,
    `whatif` and `status` say in one line which flag to pass when nothing is there (never a path
    of the repository's); with an audit in the shipped config's state file they read it; the
    wheel carries the docs' Project-URL and `lanes --help` ends with it."""
    from helpers import audit_of

    try:  # the shipped config's address: a sidecar someone runs there would answer instead
        httpx2.get("http://127.0.0.1:4098/health", timeout=1.0, trust_env=False)
        pytest.skip("a sidecar answers at 127.0.0.1:4098, the shipped config's address")
    except httpx2.TransportError:
        pass
    env = {**installed, "HOME": str(tmp_path / "home")}
    for argv, flag in (
        (["report"], "--url"),
        (["explain", "job-0"], "--url"),
        (["whatif"], "--audit"),
        (["status"], "--url"),
    ):
        done = run(env, "-m", "lanes", *argv)
        assert done.returncode in (1, 2), (argv, done.stdout)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert flag in done.stderr and "config/lanes.toml" not in done.stderr, done.stderr
    state = tmp_path / "home/.local/state/lanes/lanes.db"
    state.parent.mkdir(parents=True)
    now = time.time()  # wall-clock: the audit's jobs within the commands' default windows
    audit_of(state, ["ok"] * 4, start=now - 3600.0)
    report = run(env, "-m", "lanes", "report")
    assert report.returncode == 0, report.stderr
    assert "| — | 4 | 4 |" in report.stdout, report.stdout
    story = run(env, "-m", "lanes", "explain", "job-0")
    assert story.returncode == 0 and "request job-0" in story.stdout, story.stderr
    replayed = run(env, "-m", "lanes", "whatif", "--since", "1d")
    assert replayed.returncode == 0, replayed.stderr
    assert "fidelity: lanes.toml replayed against its own audit" in replayed.stdout
    url = _documentation_url()
    shown = run(env, "-m", "lanes", "--help")
    assert shown.stdout.rstrip().endswith(url), shown.stdout[-300:]
    carried = run(
        env,
        "-c",
        "from importlib.metadata import metadata; "
        "print(metadata('lanes-router').get_all('Project-URL'))",
    )
    assert f"Documentation, {url}" in carried.stdout, carried.stdout


def test_status_and_report_take_the_sidecar_s_address_from_its_config(installed, tmp_path):
    """`lanes status --config FILE` asks the sidecar at FILE's [server] address (it was refused);
    `lanes report --config FILE` of a config with no state file asks it too."""
    port = free_port()
    config = tmp_path / "mine.toml"
    config.write_text(f'[server]\nport = {port}\n\n[[lanes]]\nname = "ollama"\n')
    sidecar = start(installed, "serve", "--simulate", "--port", str(port))
    try:
        wait_healthy(sidecar, port)
        status = run(installed, "-m", "lanes", "status", "--config", str(config))
        report = run(installed, "-m", "lanes", "report", "--config", str(config))
    finally:
        stop(sidecar)
    assert status.returncode == 0, status.stderr
    assert "free lane on" in status.stdout
    assert report.returncode == 0 and "# lanes report since" in report.stdout, report.stderr
