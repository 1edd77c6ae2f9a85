"""A node of a cluster for the integration tests: its own home (a `Cli`) on a shared log, the cluster key, a daemon
on a free port started and stopped, and what it lists."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import openai

from tests.conftest import Cli
from tests.support import cli_zygote
from tests.support.daemon import free_port, start_serve, wait_for

CLUSTER_KEY = "cluster-secret-0123456789abcdef-0123456789"


class Node:
    def __init__(self, name: str, root: Path, url: str) -> None:
        self.name, self.port = name, free_port()
        self.cli = Cli(root / name)
        self.cli.env |= {"BLAZAR_DATABASE_URL": url, "BLAZAR_NODE_NAME": name, "BLAZAR_CLUSTER_KEY": CLUSTER_KEY}
        self.proc: subprocess.Popen[bytes] | cli_zygote.Process | None = None
        self.starts = 0

    def serve(self) -> None:
        """`blazar serve` on this node's port, up once it wrote run/daemon.json; its stderr in a file beside its
        home, one per start (`log`)."""
        self.starts += 1
        self.proc = start_serve(self.cli.home, "--port", str(self.port), log=self.log(), env=self.cli.env)
        try:
            wait_for(lambda: (self.cli.home / "run" / "daemon.json").exists(), f"node {self.name}", timeout=60,
                     proc=self.proc)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.log().read_text(errors='replace')[-8000:]}") from None

    def log(self) -> Path:
        """The stderr of this node's latest daemon."""
        return self.cli.home.parent / f"{self.name}-daemon-{self.starts}.log"

    def stop(self) -> None:
        """SIGTERM, and reap it (an unreaped child would pass for alive)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="x", max_retries=0, timeout=60)

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["name"]: n for n in self.cli("node", "list", "--json").json()["nodes"]}

    def ps(self) -> list[dict[str, Any]]:
        return self.cli("ps", "--json").json()["instances"]
