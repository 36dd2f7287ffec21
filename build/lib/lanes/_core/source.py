"""A config file as a sidecar runs it: its exact bytes, their SHA-256, and what they say.

`lanes serve --workers N` reads its file once at start, and again only on a reload: the workers are
handed these bytes (a private copy the parent owns), never the path, so a worker started again
after a crash runs the config that was running — whatever the file on disk says by then. `${NAME}`
interpolation happens where the bytes are read into a `Config`, from the environment of the
process reading them (a worker's is its parent's), exactly as for a file. The hash is the one
`sha256sum` prints for the file: it names the config in logs and on `/v1/lanes`.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from lanes._core.check import check_config
from lanes._core.config.schema import Config, load_config
from lanes._core.model.errors import ConfigError

_IDENT = re.compile(r"[A-Za-z0-9_-]+")
MAX_KEYS_SAID = 12  # changed keys named in one log line; the rest are counted


@attrs.frozen(kw_only=True)
class Source:
    """A config file's bytes and where they were read from (for messages)."""

    where: str
    data: bytes = attrs.field(repr=False)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def toml(self) -> dict[str, Any]:
        """The parsed TOML; `ConfigError` naming the file when it is not UTF-8 TOML."""
        try:
            return tomllib.loads(self.data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{self.where}: not UTF-8 (byte {exc.start})") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{self.where}: not valid TOML ({exc})") from exc

    def check(self, env: Mapping[str, str] | None = None) -> Config:
        """What `check_config` says of the file these bytes were, interpolated from `env`.
        Raises `ConfigError` naming the file and each key."""
        env = os.environ if env is None else env
        try:
            return check_config(load_config(self.toml(), env=env), env=env)
        except ConfigError as exc:
            if str(exc).startswith(f"{self.where}: "):
                raise
            raise ConfigError(f"{self.where}: {exc}", key=exc.key) from exc


def read_source(path: str | os.PathLike[str]) -> Source:
    """The file's bytes; `ConfigError` naming it when it can not be read."""
    try:
        return Source(where=str(Path(path)), data=Path(path).read_bytes())
    except OSError as exc:
        raise ConfigError(f"{Path(path)}: cannot read config ({exc.strerror})") from exc


def _name(part: str) -> str:
    return part if _IDENT.fullmatch(part) else f'"{part}"'


def _entries(value: Any) -> dict[str, Any] | None:
    """A list of tables each named by a distinct `name` (as `[[lanes]]` are), by name."""
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        return None
    names = [v.get("name") for v in value]
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        return None
    return dict(zip(names, value, strict=True))


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any], at: str = "") -> list[str]:
    """The keys that differ between two parsed config files, as the file names them
    (`policy.paid_ceiling_usd_per_day`; `lanes.groq.rpm`; `lanes.groq` for a lane added or
    removed), sorted — never a value."""
    found = []
    for key in sorted(set(old) | set(new)):
        name = f"{at}.{_name(key)}" if at else _name(key)
        if key not in old or key not in new:
            found.append(name)
            continue
        before, after = old[key], new[key]
        if isinstance(before, dict) and isinstance(after, dict):
            found += changed_keys(before, after, name)
        elif (named := _entries(before)) is not None and (now := _entries(after)) is not None:
            if list(named) != list(now) and set(named) == set(now):
                found.append(f"{name} (order)")
            found += changed_keys(named, now, name)
        elif before != after:
            found.append(name)
    return found


def said(keys: list[str]) -> str:
    """`changed_keys` for a log line: at most `MAX_KEYS_SAID` named."""
    if not keys:
        return "no key changed (comments or layout only)"
    more = len(keys) - MAX_KEYS_SAID
    return "changed " + ", ".join(keys[:MAX_KEYS_SAID]) + (f" and {more} more" if more > 0 else "")
