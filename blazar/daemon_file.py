"""run/daemon.json: where a running daemon listens (written by blazar/daemon.py once its listener is bound, removed
on exit) and how a CLI on this machine reads it. Its own module, so that a command that only talks to the daemon
does not import the server."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from blazar.paths import Paths


@dataclass(frozen=True)
class DaemonInfo:
    """The content of run/daemon.json: written once the listener is bound, removed on exit."""

    pid: int
    host: str
    port: int
    started: float
    scheme: str = "http"
    ca_file: str | None = None  # the certificate a CLI on this machine verifies https against (tls_cert)

    @property
    def url(self) -> str:
        """Where a client on this machine reaches the daemon: a wildcard bind on loopback."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return f"{self.scheme}://[{host}]:{self.port}" if ":" in host else f"{self.scheme}://{host}:{self.port}"

    @property
    def bound(self) -> str:
        """The address really bound, as a user reads it (0.0.0.0 is every interface, not loopback)."""
        return f"{self.scheme}://[{self.host}]:{self.port}" if ":" in self.host else \
            f"{self.scheme}://{self.host}:{self.port}"


def daemon_file(paths: Paths) -> Path:
    return paths.run / "daemon.json"


def read_daemon_file(paths: Paths) -> DaemonInfo | None:
    """What the last daemon wrote; None when there is no file or it cannot be read (a daemon mid-write never
    leaves a torn file: it is replaced atomically)."""
    try:
        raw = orjson.loads(daemon_file(paths).read_bytes())
        return DaemonInfo(pid=int(raw["pid"]), host=str(raw["host"]), port=int(raw["port"]),
                          started=float(raw["started"]), scheme=str(raw.get("scheme") or "http"),
                          ca_file=raw.get("ca_file"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_daemon_file(paths: Paths, info: DaemonInfo) -> None:
    target = daemon_file(paths)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(orjson.dumps(asdict(info)))
    os.replace(tmp, target)
