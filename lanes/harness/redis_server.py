"""A real `redis-server` on a free loopback port, for the tests, drills and benchmarks of the shared
state.

Debian's package (`apt-get install redis-server`; `make redis` does it when run as root). Started
with no persistence, so a kill and a restart is a Redis that forgot everything — the hardest case.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from lanes.harness.processes import free_port

CANDIDATES = ("/usr/bin/redis-server", "/usr/sbin/redis-server", "/usr/local/bin/redis-server")


def redis_server_path() -> str | None:
    return shutil.which("redis-server") or next((p for p in CANDIDATES if Path(p).exists()), None)


class RedisServer:
    def __init__(self, workdir: Path, port: int | None = None, *extra: str) -> None:
        """`extra`: more of redis-server's options (`--cluster-enabled`, `yes`)."""
        self.workdir, self.port, self.extra = workdir, port or free_port(), extra
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"redis-{self.port}.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, within_s: float = 10.0) -> RedisServer:
        binary = redis_server_path()
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed (apt-get install redis-server, or `make redis`)"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--logfile",
                str(self.log_path),
                "--daemonize",
                "no",
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + within_s  # wall-clock: waiting for a real process
        while time.monotonic() < deadline:  # wall-clock: as above
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited with {self.process.returncode}: {self._log()[-500:]}"
                )
            if self.ping():
                return self
            time.sleep(0.02)  # wall-clock: a blocking wait for a child process, outside trio
        raise RuntimeError(f"redis-server did not answer within {within_s}s: {self._log()[-500:]}")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no shutdown, no save."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def freeze(self) -> None:
        """SIGSTOP: the server keeps its sockets open and answers nothing (a hung Redis)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT: a frozen server answers again."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.thaw()
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()

    def _log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
