"""Where every command finds its inputs, the same way wherever the package is installed:

- the config: `--config`, else the one shipped inside the package (never a path relative to the
  directory the command runs in);
- the running sidecar: `--url`, else the address in that config's `[server]`;
- the audit: a sidecar that answers there, else that config's state file.

When nothing is found, one line says which flag to pass (`NotFound`, exit 2). Also where the
documentation is: the `Documentation` Project-URL the distribution carries.
"""

from __future__ import annotations

import argparse
import os
from importlib.metadata import PackageNotFoundError, metadata
from pathlib import Path

import httpx2

from lanes._core.config.schema import Config, packaged, read_config
from lanes._core.model.errors import ConfigError

#: The name it is installed under (`pip install lanes-router`); `lanes` on the index is not this.
DISTRIBUTION = "lanes-router"
#: How long a sidecar has to answer `GET /health` before the command reads the state file instead.
PROBE_S = 1.0


class NotFound(ConfigError):
    """A command found none of its inputs: one line naming the flag to pass, exit 2."""


def docs_url() -> str:
    """The documentation's address: the distribution's `Documentation` Project-URL (from
    pyproject.toml), or the docs/ folder of a source tree that was never installed."""
    try:
        urls = metadata(DISTRIBUTION).get_all("Project-URL") or []
    except PackageNotFoundError:
        urls = []
    for entry in urls:
        label, _, url = str(entry).partition(",")
        if label.strip().lower() == "documentation" and url.strip():
            return url.strip()
    return str(Path(__file__).resolve().parents[1] / "docs")


def docs_page(page: str) -> str:
    """The address of one page of the documentation ("reference/config": docs/reference/config.md,
    served as reference/config/)."""
    base = docs_url()
    if base.startswith(("http://", "https://")):
        return f"{base.rstrip('/')}/{page}/"
    return str(Path(base) / f"{page}.md")


def config_path(args: argparse.Namespace) -> str:
    """`--config`, else the config shipped inside the package."""
    return str(getattr(args, "config", None) or packaged("lanes.toml"))


def _read(path: str) -> Config:
    return read_config(path, env={})  # the file's shape only: no key is read


def sidecar_url(args: argparse.Namespace) -> str:
    """`--url`, else the address the config (`--config`, else the shipped one) serves on."""
    if url := getattr(args, "url", None):
        return str(url)
    try:
        server = _read(config_path(args)).server
    except ConfigError:
        if getattr(args, "config", None):
            raise
        server = None  # a broken shipped config: the default address
    host = "127.0.0.1" if server is None or server.host in ("0.0.0.0", "::", "") else server.host
    port = 4098 if server is None else server.port
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def answers(url: str) -> bool:
    """Whether a sidecar answers `GET /health` at `url` within `PROBE_S`."""
    try:
        with httpx2.Client(timeout=PROBE_S, trust_env=False) as client:
            return client.get(f"{url}/health").status_code == 200
    except httpx2.HTTPError:
        return False


def sidecar_state(url: str) -> str | None:
    """Where the sidecar answering at `url` keeps its local state (`GET /v1/lanes`: a file, or
    `:memory:`), or None when none answers (or it does not say)."""
    headers = {}
    if key := os.environ.get("LANES_KEY", "").strip():
        headers["authorization"] = f"Bearer {key}"
    try:
        with httpx2.Client(timeout=PROBE_S, trust_env=False) as client:
            answer = client.get(f"{url}/v1/lanes", headers=headers)
        state = answer.json().get("state") if answer.status_code == 200 else None
    except (httpx2.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(state, dict) or state.get("kind") != "sqlite":
        return None
    where = state.get("where")
    return where if isinstance(where, str) else None


def state_of(path: str) -> str:
    """The local state the config at `path` names (where its audit is): a file, or `:memory:`."""
    config = _read(path)
    return config.local_state if config.shared_state else config.state


def state_file(path: str) -> Path | None:
    """The local SQLite state file of the config at `path`, or None when it keeps its state in
    memory or the file does not exist yet."""
    state = state_of(path)
    file = Path(state).expanduser()
    return file if state != ":memory:" and file.is_file() else None


def audit_source(args: argparse.Namespace) -> tuple[str, str]:
    """Where `report` and `explain` read the audit: ("url", the sidecar's address) or ("file",
    the config whose state file holds it). `--url` is asked; with `--config`, its state file is
    read, else the sidecar at its address; with neither, the sidecar at the shipped config's
    address, else that config's state file. `NotFound` when none is there."""
    if getattr(args, "url", None):
        return "url", str(args.url)
    given = bool(getattr(args, "config", None))
    path, url = config_path(args), sidecar_url(args)
    if given and state_file(path) is not None:
        return "file", path
    if answers(url):
        return "url", url
    if state_file(path) is not None:
        return "file", path
    whose = f"{path}'s" if given else "the shipped config's"
    raise NotFound(
        f"no audit found: no sidecar answers at {url}, and {whose} state ({state_of(path)}) is "
        "no file yet; pass --url URL of the running sidecar, or --config FILE of the config it "
        "runs with"
    )
