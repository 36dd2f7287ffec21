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
from typing import Any

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


class RedisSentinels:
    """Replicas of a running `RedisServer` and three sentinels watching it as `service` on
    loopback, failing over one second after the master stops answering (for the failover test
    and drill). `start()` returns once every sentinel knows every replica and a write is
    acknowledged by all of them."""

    def __init__(self, master: RedisServer, workdir: Path, *, replicas: int = 1) -> None:
        self.master, self.workdir, self.service = master, workdir, "lanes-master"
        self.replicas = [
            RedisServer(
                workdir / f"replica-{i}", None, "--replicaof", "127.0.0.1", str(master.port)
            )
            for i in range(replicas)
        ]
        self.ports = [free_port() for _ in range(3)]
        self._sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"redis+sentinel://{hosts}/{self.service}"

    def start(self, within_s: float = 30.0) -> RedisSentinels:
        import redis  # the harness' other users need no client

        redis.Redis(port=self.master.port).config_set("repl-diskless-sync-delay", 0)
        for replica in self.replicas:  # each may become the master: none waits to sync
            redis.Redis(port=replica.start().port).config_set("repl-diskless-sync-delay", 0)
        binary = redis_server_path()
        assert binary is not None  # the master runs
        for port in self.ports:
            folder = self.workdir / f"sentinel-{port}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "sentinel.conf").write_text(
                f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {self.service} 1000\n"
                f"sentinel failover-timeout {self.service} 5000\n"
            )
            self._sentinels.append(
                subprocess.Popen(
                    [binary, str(folder / "sentinel.conf"), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        primary = redis.Redis(port=self.master.port, socket_timeout=2)
        deadline = time.monotonic() + within_s  # wall-clock: real processes agreeing
        while not (all(self._sees(port) for port in self.ports) and self._acked(primary)):
            if time.monotonic() > deadline:  # wall-clock: as above
                self.stop()
                raise RuntimeError(f"the sentinels were not ready within {within_s:g}s")
            time.sleep(0.1)  # wall-clock: a blocking wait for child processes, outside trio
        primary.delete("lanes-harness-probe")
        return self

    def _sees(self, port: int) -> bool:
        """The sentinel on `port` answers, knows every replica and the two other sentinels."""
        import redis

        try:
            client = redis.Redis(port=port, decode_responses=True, socket_timeout=1)
            master: Any = client.sentinel_master(self.service)
            known: Any = client.sentinel_slaves(self.service)
        except redis.RedisError:
            return False
        ports = {int(r.get("port", 0)) for r in known if "s_down" not in str(r.get("flags"))}
        return int(master.get("num-other-sentinels", 0)) >= 2 and ports >= {
            r.port for r in self.replicas
        }

    def _acked(self, primary: Any) -> bool:
        """A write acknowledged by every replica (the sentinels may have one sync again as they
        start)."""
        primary.set("lanes-harness-probe", 1)
        return int(primary.wait(len(self.replicas), 1000)) == len(self.replicas)

    def master_port(self) -> int:
        """The master's port as the first sentinel names it now."""
        import redis

        client = redis.Redis(port=self.ports[0], socket_timeout=1)
        address: Any = client.sentinel_get_master_addr_by_name(self.service)
        return int(address[1])

    def stop(self) -> None:
        for process in self._sentinels:
            process.kill()
            process.wait()
        for replica in self.replicas:
            replica.stop()
