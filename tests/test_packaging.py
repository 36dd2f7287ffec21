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
