"""A real `blazar serve` over https: a self-signed certificate for localhost, and a daemon serving with it."""

from __future__ import annotations

import contextlib
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx2

from tests.support.daemon import free_port, start_serve, wait_for
from tests.support.homes import configure_all, model_home
from tests.support.serving import stop_daemon


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
    model_home(home, engine_binary, gemma_path, "gemma")
    configure_all(home, {"tls_cert": cert, "tls_key": key, "ctx": 512, "slots": 1})
    port = free_port()
    proc = start_serve(home, "--port", str(port), log=home.parent / f"{home.name}-daemon.log")

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
