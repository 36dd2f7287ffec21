"""Shared fixtures: fake providers on loopback, configs pointing at them, the FREE_LANE switch, the
`slow` mark for every test that asks for a fixture starting a process, and the xdist groups."""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpcore2
import httpx2
import pytest
from hypothesis import settings

from helpers import FREE_KEY, PAID_KEY, QUICK, examples

# The whole suite searches 200 examples a property; `make test-quick` (LANES_TEST_QUICK=1) a fifth
# of that, and of every count a test sets with `examples(n)`: the same properties, searched less
# deeply in the inner loop.
settings.register_profile("lanes", derandomize=True, deadline=None, max_examples=examples(200))
settings.load_profile("lanes")
assert QUICK or settings.get_profile("lanes").max_examples == 200

# Every HTTP client made in this process — each test's, each dispatcher's — loads the CA bundle
# afresh (httpx2 builds its default TLS context per client: ~40 ms of CPU, a tenth of the suite's
# time in-process), and none of them speaks TLS: everything here is plain HTTP on 127.0.0.1. They
# share one default context, made once (per `_trust_env`; nothing here changes a context).
httpcore2.default_ssl_context = functools.cache(httpcore2.default_ssl_context)

FREE_LANE_OFF = os.environ.get("FREE_LANE", "").strip().lower() in {
    "off",
    "0",
    "false",
    "no",
    "disabled",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--clients",
        action="store_true",
        default=False,
        help="also collect tests/clients: the real clients (make test-clients)",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """tests/clients runs only when asked (`--clients`): its clients are heavy to install."""
    if collection_path == Path(__file__).parent / "clients":
        return not config.getoption("--clients")
    return None


#: Fixtures that start a process: a test asking for one is `slow`.
PROCESS_FIXTURES = {"redis_server", "simulated"}


def starts_a_process(item: pytest.Item) -> bool:
    """The test asks for a fixture that starts a process, or is parametrized onto Redis (whose
    fixture then asks for `redis_server` through `request.getfixturevalue`)."""
    if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and "redis" in callspec.params.values()


def shares_a_module_fixture(item: pytest.Item) -> bool:
    """The test asks (directly or through another fixture) for one of our module-scoped fixtures:
    a `lanes serve --simulate` process, a recorded day, a built wheel."""
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(
        d.scope != "function" and d.baseid.startswith("tests")
        for defs in info.name2fixturedefs.values()
        for d in defs
    )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (`--dist loadgroup`)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if starts_a_process(item):
            item.add_marker(pytest.mark.slow)
        if shares_a_module_fixture(item):
            # one worker runs the module's tests that share it, so it is made once per run
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if not FREE_LANE_OFF:
        return
    skip = pytest.mark.skip(reason="about the borrowed-free lane itself; FREE_LANE=off")
    for item in items:
        if "free_lane" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def redis_server(tmp_path):
    """A real redis-server on a free loopback port (Debian's package), stopped after the test.

    Missing binary: the test skips — unless LANES_REQUIRE_REDIS=1 (as `.ci/run` sets), where it
    fails."""
    from lanes.harness.redis_server import RedisServer, redis_server_path

    if redis_server_path() is None:
        message = "redis-server is not installed (make redis, or apt-get install redis-server)"
        if os.environ.get("LANES_REQUIRE_REDIS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def env() -> dict[str, str]:
    """The process environment (so FREE_LANE=off reaches every dispatcher) plus test keys."""
    return {**os.environ, "PAID_API_KEY": PAID_KEY, "FREE_API_KEY": FREE_KEY}


@pytest.fixture
def caplog_lanes(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="lanes")
    return caplog


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`lanes serve --simulate` in a child process; its base URL (…/v1)."""
    from lanes.harness.processes import free_port

    port = free_port()
    log = Path(tmp_path_factory.mktemp("simulate")) / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "lanes", "serve", "--simulate", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        start = time.monotonic()  # wall-clock: a real process starting
        while True:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() - start < 20, f"no /health within 20 s: {log.read_text()}"
            try:
                if httpx2.get(f"{base}/health", timeout=0.5).status_code == 200:
                    break
            except httpx2.TransportError:
                time.sleep(0.05)
        yield f"{base}/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(params=["sqlite", "redis"])
def entries(request, tmp_path):
    """The response cache's entries, over each store: a SQLite file and a real redis-server."""
    store: Any
    if request.param == "sqlite":
        from lanes._core.cache.store import SQLiteEntries

        store = SQLiteEntries(str(tmp_path / "state.db.cache"))
    else:
        from lanes._core.cache.redis_entries import RedisEntries

        server = request.getfixturevalue("redis_server")
        store = RedisEntries(server.url, namespace="t1")
    try:
        yield store
    finally:
        store.close()
