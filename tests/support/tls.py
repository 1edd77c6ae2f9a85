"""A real `blazar serve` over https: a self-signed certificate for localhost, and a daemon serving with it."""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2

from tests.support.daemon import free_port, wait_for
from tests.support.serving import blazar_cli, stop_daemon


def self_signed(where: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1 (a day's, made with openssl) and its key, written in `where`."""
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@contextlib.contextmanager
def serving_tls(home: Path, engine_binary: Path, gemma_path: Path, cert: Path, key: Path
                ) -> Iterator[tuple[int, str]]:
    """`blazar serve` over https with `cert` and `key`, the real engine and the real Gemma (as "gemma"): its port
    and base URL once /health answers."""
    blazar_cli(home, "engine", "install", "--path", str(engine_binary))
    blazar_cli(home, "import", str(gemma_path), "--name", "gemma")
    for k, v in (("tls_cert", cert), ("tls_key", key), ("ctx", 512), ("slots", 1)):
        blazar_cli(home, "config", "set", k, str(v))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "blazar.cli.main", "serve", "--port", str(port)],
                            env={**os.environ, "BLAZAR_HOME": str(home)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)

    def up() -> bool:
        try:
            return httpx2.get(f"https://127.0.0.1:{port}/health", verify=ssl.create_default_context(cafile=str(cert)),
                              timeout=2, trust_env=False).status_code == 200
        except httpx2.TransportError:
            return False

    try:
        wait_for(up, "https /health", proc=proc)
        yield port, f"https://127.0.0.1:{port}"
    finally:
        stop_daemon(proc)
