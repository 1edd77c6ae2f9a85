"""A local stand-in for the Hugging Face Hub's file protocol, for tests that drive the real `huggingface_hub` client:
the model search (/api/models, paged by Link headers), model info and tree listings, HEAD/GET on /resolve with the
hub's headers, LFS redirects to a "CDN", Range requests, hub error codes, a gated repo, fault knobs and a
request log."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

COMMIT = "6f1c2d3e4a5b697887a6b5c4d3e2f1a0b9c8d7e6"  # the one commit every repo is at
LFS_SUFFIXES = (".gguf", ".bin", ".safetensors")
SERVE_CHUNK = 16 * 1024

_SEARCH = re.compile(r"^/api/models/?$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+(?:/[^/]+)??)(?:/revision/(?P<rev>[^/]+))?$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+(?:/[^/]+)?)/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+(?:/[^/]+)?)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_CDN = re.compile(r"^/cdn/(?P<sha>[0-9a-f]{64})$")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class LoggedRequest:
    server: str  # "hub" or "cdn"
    method: str
    path: str  # as sent, without the query
    range: str | None
    authorized: bool  # an Authorization header was sent


class _Blob:
    """One file of a repo: its bytes (or where they are on disk) and the hashes the hub advertises for it."""

    def __init__(self, path: str, content: bytes | Path) -> None:
        self.path = path
        self._content = content
        data = content.read_bytes() if isinstance(content, Path) else content
        self.size = len(data)
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.lfs = path.lower().endswith(LFS_SUFFIXES)
        self.pointer = (f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n"
                        .encode())
        # The git object behind an LFS file is its pointer; behind any other file, the file itself.
        self.blob_id = git_blob_sha1(self.pointer if self.lfs else data)

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the file."""
        if isinstance(self._content, Path):
            with self._content.open("rb") as f:
                f.seek(start)
                return f.read(end - start)
        return self._content[start:end]

    def sibling(self, with_blobs: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"rfilename": self.path}
        if with_blobs:
            out["size"] = self.size
            out["blobId"] = self.blob_id
            if self.lfs:
                out["lfs"] = {"sha256": self.sha256, "size": self.size, "pointerSize": len(self.pointer)}
        return out

    def tree_entry(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "file", "oid": self.blob_id, "size": self.size, "path": self.path}
        if self.lfs:
            out["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": len(self.pointer)}
        return out


class HubServer:
    """Serves `repos` ({repo_id: {path: bytes | Path}}) on 127.0.0.1 like the hub does, with LFS files redirected
    to a second listener (another origin, as the hub's CDN is) unless `redirect_lfs` is False.

    Knobs, settable while running: `fail_after_bytes` cuts the next file body after that many bytes (once);
    `corrupt` serves every file with one byte flipped (sizes unchanged, hashes wrong); `delay_per_chunk` pauses
    between 16 KiB chunks of a body; `honour_range` False answers every Range with the whole file (200), as some
    proxies do. `requests` is the log of what was asked, in order.

    The search answers `search` (a substring of the repo id, any case), `filter` (tags: "gguf" for a repo with a
    .gguf file), `sort=downloads` (from `downloads`, {repo: count}) and `limit`, `page_size` repos a page at most.
    """

    def __init__(self, repos: Mapping[str, Mapping[str, bytes | Path]], *, gated: Iterable[str] = (),
                 token: str | None = None, redirect_lfs: bool = True, downloads: Mapping[str, int] | None = None,
                 page_size: int = 1000) -> None:
        self.repos = {repo: {p: _Blob(p, c) for p, c in sorted(files.items())} for repo, files in repos.items()}
        self.downloads = dict(downloads or {})
        self.page_size = page_size
        self.gated = frozenset(gated)
        self.token = token
        self.redirect_lfs = redirect_lfs
        self.fail_after_bytes: int | None = None
        self.corrupt = False
        self.delay_per_chunk = 0.0
        self.honour_range = True
        self._log: list[LoggedRequest] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._by_sha = {b.sha256: b for files in self.repos.values() for b in files.values()}
        self._servers = [self._make_server("hub"), self._make_server("cdn")]
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._servers[0].server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self._servers[1].server_address[1]}"

    @property
    def requests(self) -> list[LoggedRequest]:
        with self._lock:
            return list(self._log)

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    def blob(self, repo: str, path: str) -> _Blob:
        return self.repos[repo][path]

    def __enter__(self) -> HubServer:
        for srv in self._servers:
            t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        for t in self._threads:
            t.join(timeout=5)

    # -- internals used by the handler --------------------------------------------------------------------------

    def _make_server(self, role: str) -> ThreadingHTTPServer:
        hub = self

        class Handler(_Handler):
            server_role = role
            owner = hub

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        srv.daemon_threads = True
        return srv

    def _record(self, entry: LoggedRequest) -> None:
        with self._lock:
            self._log.append(entry)

    def _take_fault(self) -> int | None:
        with self._lock:
            cut, self.fail_after_bytes = self.fail_after_bytes, None
            return cut


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and Content-Length, as the hub's clients expect
    server_role = "hub"
    owner: HubServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the request log is in HubServer.requests
        return

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def _dispatch(self, head: bool) -> None:
        split = urlsplit(self.path)
        self.owner._record(LoggedRequest(self.server_role, self.command, split.path, self.headers.get("Range"),
                                         self.headers.get("Authorization") is not None))
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        if self.server_role == "cdn":
            m = _CDN.match(split.path)
            blob = self.owner._by_sha.get(m["sha"]) if m else None
            if blob is None:
                return self._error(404, "EntryNotFound", "Not found")
            return self._send_file(blob, head, {"ETag": f'"{blob.sha256}"'})
        if _SEARCH.match(split.path):
            return self._search(parse_qs(split.query))
        if m := _TREE.match(split.path):
            return self._tree(unquote(m["repo"]), unquote(m["rev"]), unquote(m["path"] or ""), query)
        if m := _INFO.match(split.path):
            return self._info(unquote(m["repo"]), unquote(m["rev"] or "main"), query)
        if m := _RESOLVE.match(split.path):
            return self._resolve(unquote(m["repo"]), unquote(m["rev"]), unquote(m["path"]), head)
        self._error(404, None, "Not found")

    # -- the hub's API ------------------------------------------------------------------------------------------

    def _repo(self, repo: str, rev: str) -> dict[str, _Blob] | None:
        files = self.owner.repos.get(repo)
        if files is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if rev not in ("main", COMMIT):
            self._error(404, "RevisionNotFound", "Invalid rev id: " + rev)
            return None
        return files

    def _tags(self, repo: str) -> list[str]:
        return ["gguf"] if any(p.lower().endswith(".gguf") for p in self.owner.repos[repo]) else []

    def _search(self, query: dict[str, list[str]]) -> None:
        text = query.get("search", [""])[-1].lower()
        wanted = query.get("filter", [])
        found = [r for r in sorted(self.owner.repos) if text in r.lower() and set(wanted) <= set(self._tags(r))]
        if query.get("sort", [""])[-1] == "downloads":
            found.sort(key=lambda r: -self.owner.downloads.get(r, 0))
        start = int(query.get("cursor", ["0"])[-1])
        size = min(int(query.get("limit", ["1000"])[-1]), self.owner.page_size)
        page = found[start:start + size]
        body = [{"_id": "0" * 24, "id": r, "modelId": r, "likes": 0, "downloads": self.owner.downloads.get(r, 0),
                 "private": False, "tags": self._tags(r), "createdAt": "2025-01-01T00:00:00.000Z"} for r in page]
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(data))}
        if start + size < len(found):
            rest = {k: v for k, v in query.items() if k != "cursor"} | {"cursor": [str(start + size)]}
            headers["Link"] = f'<{self.owner.url}/api/models?{urlencode(rest, doseq=True)}>; rel="next"'
        self._send(200, headers, data)

    def _info(self, repo: str, rev: str, query: dict[str, str]) -> None:
        files = self._repo(repo, rev)
        if files is None:
            return
        with_blobs = query.get("blobs", "").lower() == "true"
        body = {
            "_id": "0" * 24, "id": repo, "modelId": repo, "author": repo.split("/")[0], "sha": COMMIT,
            "lastModified": "2025-01-01T00:00:00.000Z", "private": False,
            "gated": "manual" if repo in self.owner.gated else False, "disabled": False, "tags": ["gguf"],
            "siblings": [b.sibling(with_blobs) for b in files.values()],
        }
        self._json(200, body)

    def _tree(self, repo: str, rev: str, prefix: str, query: dict[str, str]) -> None:
        files = self._repo(repo, rev)
        if files is None:
            return
        recursive = query.get("recursive", "").lower() == "true"
        base = prefix.strip("/") + "/" if prefix.strip("/") else ""
        entries: dict[str, dict[str, Any]] = {}
        for path, blob in files.items():
            if not path.startswith(base):
                continue
            rest = path[len(base):]
            parts = rest.split("/")
            # Folders come before what is in them, as the hub lists them.
            for depth in range(1, len(parts) if recursive else min(len(parts), 2)):
                folder = base + "/".join(parts[:depth])
                entries.setdefault(folder, {"type": "directory", "oid": git_blob_sha1(folder.encode()), "size": 0,
                                            "path": folder})
            if recursive or len(parts) == 1:
                entries[path] = blob.tree_entry()
        if base and not entries:
            return self._error(404, "EntryNotFound", f"{prefix} does not exist on {rev}")
        self._json(200, list(entries.values()))

    def _resolve(self, repo: str, rev: str, path: str, head: bool) -> None:
        files = self._repo(repo, rev)
        if files is None:
            return
        if repo in self.owner.gated and not self._gate_open(repo):
            return
        blob = files.get(path)
        if blob is None:
            return self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": COMMIT})
        headers = {"X-Repo-Commit": COMMIT}
        if blob.lfs:
            headers |= {"X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(blob.size),
                        "ETag": f'"{blob.blob_id}"'}
            if self.owner.redirect_lfs:
                headers |= {"Location": f"{self.owner.cdn_url}/cdn/{blob.sha256}", "Content-Length": "0"}
                return self._send(302, headers, b"")
        else:
            headers["ETag"] = f'"{blob.blob_id}"'
        self._send_file(blob, head, headers)

    def _gate_open(self, repo: str) -> bool:
        auth = self.headers.get("Authorization")
        if auth is None:
            self._error(401, "GatedRepo", f"Access to model {repo} is restricted. You must have access to it "
                                          "and be authenticated to access it. Please log in.")
            return False
        if self.owner.token is None or auth != f"Bearer {self.owner.token}":
            self._error(403, "GatedRepo", f"Access to model {repo} is restricted and you are not in the "
                                          "authorized list.")
            return False
        return True

    # -- bodies -------------------------------------------------------------------------------------------------

    def _send_file(self, blob: _Blob, head: bool, headers: dict[str, str]) -> None:
        start, end = 0, blob.size
        status = 200
        wanted = self.headers.get("Range")
        if wanted is not None and self.owner.honour_range:
            parsed = self._parse_range(wanted, blob.size)
            if parsed is None:
                return self._send(416, {"Content-Range": f"bytes */{blob.size}", "Content-Length": "0"}, b"")
            start, end = parsed
            status = 206
            headers = headers | {"Content-Range": f"bytes {start}-{end - 1}/{blob.size}"}
        headers = headers | {"Content-Length": str(end - start), "Accept-Ranges": "bytes",
                             "Content-Type": "application/octet-stream"}
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if head:
            return
        cut = self.owner._take_fault()
        for offset, chunk in self._chunks(blob, start, end):
            if cut is not None and offset - start + len(chunk) > cut:
                # Half a body, then a closed connection: what a dropped download looks like to the client.
                self.wfile.write(chunk[: max(cut - (offset - start), 0)])
                self.close_connection = True
                return
            try:
                self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
                return
            if self.owner.delay_per_chunk and self.owner._stopping.wait(self.owner.delay_per_chunk):
                return

    def _chunks(self, blob: _Blob, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        flip = blob.size // 2
        for offset in range(start, end, SERVE_CHUNK):
            chunk = blob.read(offset, min(offset + SERVE_CHUNK, end))
            if self.owner.corrupt and offset <= flip < offset + len(chunk):
                i = flip - offset
                chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1:]
            yield offset, chunk

    @staticmethod
    def _parse_range(value: str, size: int) -> tuple[int, int] | None:
        m = _RANGE.match(value.strip())
        if m is None or (not m[1] and not m[2]):
            return None
        if not m[1]:  # a suffix: the last N bytes
            return max(size - int(m[2]), 0), size
        start = int(m[1])
        end = min(int(m[2]) + 1, size) if m[2] else size
        return (start, end) if start < size and start < end else None

    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self._send(status, {"Content-Type": "application/json", "Content-Length": str(len(data))}, data)

    def _error(self, status: int, code: str | None, message: str, extra: dict[str, str] | None = None) -> None:
        data = json.dumps({"error": message}).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(data)),
                   "X-Error-Message": message} | (extra or {})
        if code is not None:
            headers["X-Error-Code"] = code
        self._send(status, headers, b"" if self.command == "HEAD" else data)

    def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if body:
            self.wfile.write(body)

