"""A throwaway PostgreSQL cluster for the tests: `initdb` into a temporary directory, `pg_ctl start` on a free
loopback port (trust auth, its socket in that directory too), a fresh database per test, stopped at the end.

The binaries come from BLAZAR_TEST_PG_BIN, else the newest /usr/lib/postgresql/*/bin (Debian's `postgresql`
package, which `.ci/run` installs), else `initdb` on PATH. initdb refuses to run as root: as root the cluster is made
and run by the `postgres` user the package creates. Without PostgreSQL the PostgreSQL backend's tests skip, unless
BLAZAR_REQUIRE_POSTGRES=1 (CI) makes that a failure.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from blazar.adapters.engines.process import free_port

USER = "blazar"
START_TIMEOUT_S = 60


def pg_bin() -> Path | None:
    explicit = os.environ.get("BLAZAR_TEST_PG_BIN")
    if explicit:
        return Path(explicit)
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name)
                      if p.parent.parent.name.isdigit() else 0)
    if versions:
        return versions[-1].parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def unavailable(why: str) -> None:
    if os.environ.get("BLAZAR_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"PostgreSQL is required here (BLAZAR_REQUIRE_POSTGRES=1): {why}")
    pytest.skip(f"no PostgreSQL: {why}")


class Cluster:
    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.dir = Path(tempfile.mkdtemp(prefix="blazar-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self._names = itertools.count(1)
        self._as: list[str] = []
        if os.geteuid() == 0:
            # initdb and postgres refuse root: the package's `postgres` user owns and runs the cluster.
            shutil.chown(self.dir, user="postgres")
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([*self._as, *argv], capture_output=True, text=True, timeout=START_TIMEOUT_S,
                              check=False, cwd=self.dir)

    def start(self) -> None:
        init = self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", USER, "-E", "UTF8",
                         "--no-sync")
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stderr[-800:]}")
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c max_connections=200")
        started = self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l",
                            str(self.dir / "server.log"), "-w", "-t", str(START_TIMEOUT_S), "start")
        if started.returncode != 0:
            log = (self.dir / "server.log").read_text(errors="replace")[-800:] if (self.dir / "server.log").exists() \
                else ""
            raise RuntimeError(f"pg_ctl start failed: {started.stderr[-400:]} {log}")

    def halt(self) -> None:
        """Stop the server (its data kept): what a crash or an outage looks like to clients."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def resume(self) -> None:
        """Start it again after `halt`, on the same port."""
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c max_connections=200")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.dir / "server.log"), "-w",
                  "start")

    def stop(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+asyncpg://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        name = f"t{os.getpid()}_{next(self._names)}"
        made = subprocess.run([str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, "-d",
                               "postgres", "-v", "ON_ERROR_STOP=1", "-qc", f'CREATE DATABASE "{name}"'],
                              capture_output=True, text=True, timeout=30, check=False)
        if made.returncode != 0:
            raise RuntimeError(f"CREATE DATABASE failed: {made.stderr}")
        return self.url(name)


_cluster: Cluster | None = None


def cluster() -> Cluster:
    """The session's cluster, started on first use (the caller skips or fails when PostgreSQL is missing)."""
    global _cluster
    if _cluster is None:
        bin_dir = pg_bin()
        if bin_dir is None or not (bin_dir / "initdb").exists():
            unavailable("no initdb (install Debian's postgresql, or set BLAZAR_TEST_PG_BIN)")
        assert bin_dir is not None
        c = Cluster(bin_dir)
        try:
            c.start()
        except (RuntimeError, OSError, LookupError) as e:
            c.stop()
            unavailable(str(e))
        _cluster = c
    return _cluster


def stop_cluster() -> None:
    global _cluster
    if _cluster is not None:
        _cluster.stop()
        _cluster = None
