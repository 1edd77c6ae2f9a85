"""The hub adapter: lists, resolves and downloads GGUF files from a Hugging Face hub endpoint through the real
`huggingface_hub` client, into a directory Blazar chooses; downloads resume, verify and can be cancelled.

How the exchange goes (huggingface_hub 2.x):
- listing: `HfApi.model_info(files_metadata=True)` = GET /api/models/{repo}/revision/{rev}?blobs=true, which gives
  the commit and every file with its size and LFS sha256 in one request (and, unlike `list_repo_tree`, does not
  retry a dead endpoint for half a minute);
- download: `get_hf_file_metadata` = HEAD /{repo}/resolve/{commit}/{path} (the client follows hub redirects, reads
  X-Repo-Commit, X-Linked-Etag, X-Linked-Size and the CDN Location), then one GET of that location over the
  client's own session (`get_session`, `build_hf_headers`, `hf_raise_for_status`), with `Range: bytes=N-` when a
  partial file is there.
- NOTE: not `hf_hub_download`: in 2.x it writes to a per-process temporary file that it deletes on failure (no
  resume across attempts), cannot be cancelled, and reports progress per 10 MiB; `http_get` shares the last two
  and retries on its own with sleeps. Retrying is the pull handler's decision, recorded as an event.

Files go to `dest_dir/<path in repo>`; bytes arrive in `<that>.incomplete` and are renamed only once they hash to
what the hub advertised, so a file at its final name has been verified.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import httpx2
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    FileMetadataError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from blazar.errors import ChecksumMismatch, DownloadCancelled, HubAccessDenied, HubError, HubUnavailable, NotFoundOnHub

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_QUANT = "Q4_K_M"

Progress = Callable[[int, int], None]  # (bytes on disk, total bytes)

_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<parts>\d{5})\.gguf$", re.IGNORECASE)
_QUANT = re.compile(r"(?<![A-Za-z0-9])((?:I?Q|TQ)\d(?:_[A-Za-z0-9]+)*|BF16|F16|F32)(?![A-Za-z0-9])", re.IGNORECASE)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_SEARCH_PAGES = 10  # pages of /api/models followed for one search (the hub sends up to `limit` per page)


@dataclass(frozen=True)
class RemoteFile:
    """A file on the hub as listed: `sha256` is its LFS hash (None for a file kept in git itself, which is checked
    against its git `blob_id` instead); `revision` is the commit it was listed at, so a download gets those bytes."""

    path: str
    size: int
    sha256: str | None
    blob_id: str | None = None
    revision: str = "main"

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name


@dataclass(frozen=True)
class RemoteRepo:
    """A repository a search found: its id and, where the hub says, its downloads and likes."""

    repo: str
    downloads: int | None = None
    likes: int | None = None


@dataclass(frozen=True)
class RemoteModel:
    """One loadable model of a repo: a single GGUF, or the parts of a split one (`complete` False when some are
    missing), with the quant its name gives (None when it names none)."""

    files: tuple[RemoteFile, ...]
    quant: str | None
    complete: bool

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def hub_from_env(env: Mapping[str, str]) -> Hub:
    """The hub Blazar talks to, from HF_ENDPOINT (default huggingface.co) and HF_TOKEN; bootstrap passes os.environ."""
    return Hub(endpoint=env.get("HF_ENDPOINT") or None, token=env.get("HF_TOKEN") or None)


class Hub:
    """One hub endpoint and the token for it. Safe to share between threads: the client's session holds no per-call
    state, and a download locks its partial file (a second download of the same file is refused meanwhile)."""

    def __init__(self, endpoint: str | None = None, token: str | None = None, *, timeout_s: float = 10.0,
                 chunk_bytes: int = 1 << 20) -> None:
        self.endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
        # NOTE: False, never None: given None, huggingface_hub looks for a token itself (HF_TOKEN, the token file),
        # and only bootstrap reads the environment.
        self._token: str | bool = token or False
        self.timeout_s = timeout_s
        self.chunk_bytes = chunk_bytes
        self._api = HfApi(endpoint=self.endpoint, token=self._token, library_name="blazar")

    @property
    def has_token(self) -> bool:
        return self._token is not False

    # -- listing ------------------------------------------------------------------------------------------------

    def list_gguf_files(self, repo: str, revision: str = "main") -> list[RemoteFile]:
        """Every .gguf file in `repo` at `revision`, by path, each pinned to the commit `revision` pointed at."""
        with self._translated(repo, revision=revision):
            info = self._api.model_info(repo, revision=revision, files_metadata=True, timeout=self.timeout_s)
        commit = info.sha or revision
        files = []
        for s in info.siblings or []:
            if not s.rfilename.lower().endswith(".gguf"):
                continue
            size = s.lfs.size if s.lfs is not None else s.size
            if size is None:
                raise HubError(f"{self.endpoint} listed {repo}/{s.rfilename} without its size", repo=repo,
                               filename=s.rfilename)
            files.append(RemoteFile(s.rfilename, size, s.lfs.sha256 if s.lfs is not None else None, s.blob_id,
                                    commit))
        return sorted(files, key=lambda f: f.path)

    def search(self, query: str, limit: int) -> list[RemoteRepo]:
        """The GGUF repos whose id matches `query`, most downloaded first, at most `limit`.

        NOTE: the request `HfApi.list_models(search=, filter="gguf", sort="downloads", limit=)` sends (GET
        /api/models, the Link header's next page followed), made here over the client's session: list_models has no
        timeout and retries a dead endpoint five times with sleeps (23 s), where a search should fail in one."""
        url: str | None = f"{self.endpoint}/api/models"
        params: dict[str, str | int] | None = {"search": query, "filter": "gguf", "sort": "downloads",
                                               "limit": limit}
        found: list[RemoteRepo] = []
        what = f"the search {query!r}"
        for _ in range(MAX_SEARCH_PAGES):
            if url is None or len(found) >= limit:
                break
            try:
                with self._translated(what):
                    resp = get_session().get(url, params=params, headers=self._headers(to=url),
                                             timeout=self.timeout_s)
                    hf_raise_for_status(resp)
            except NotFoundOnHub as e:
                # A search names no repo or file: the hub's "not found" answers (a 401 is one) refuse the search.
                raise HubError(f"{self.endpoint} refused {what} ({resp.status_code}); is it a Hugging Face hub "
                               "endpoint, and is HF_TOKEN valid for it?") from e
            found += _repos(resp, self.endpoint)[:limit - len(found)]
            url, params = resp.links.get("next", {}).get("url"), None  # the next link carries the query
        return found[:limit]

    def resolve(self, repo: str, spec: str | None = None, revision: str = "main") -> list[RemoteFile]:
        """The files of one model in `repo`: `spec` is a quant ("Q4_K_M", any case) or a file path or name; split
        files ("x-00001-of-00003.gguf") come together, in order. No spec: Q4_K_M, else the repo's only model."""
        files = self.list_gguf_files(repo, revision)
        if spec is not None and spec.lower().endswith(".gguf"):
            chosen = [f for f in files if spec in (f.path, f.name)]
            if not chosen:
                raise NotFoundOnHub(f"no file {spec!r} in {repo} at {revision}; GGUF files there: "
                                    f"{_listing([f.path for f in files])}", repo=repo, filename=spec)
            groups = _group([f for f in files if _group_key(f) == _group_key(chosen[0])])
        else:
            candidates = _quant_matches(files, spec or DEFAULT_QUANT)
            if not candidates and spec is None:
                # No Q4_K_M: a repo that holds one model (single or split) needs no spec.
                candidates = [f for f in files if not _is_projector(f)]
                if len(_group(candidates)) != 1:
                    candidates = []
            if not candidates:
                raise NotFoundOnHub(f"no {spec or DEFAULT_QUANT} file in {repo} at {revision}; quants there: "
                                    f"{_listing(available_quants(files))}", repo=repo)
            groups = _group(candidates)
        if len(groups) > 1:
            raise HubError(f"{spec or DEFAULT_QUANT!r} matches {len(groups)} models in {repo}: "
                           f"{_listing([g[0].path for g in groups])}; name the file instead", repo=repo)
        return _complete(repo, groups[0])

    def projector_for(self, repo: str, model: list[RemoteFile]) -> RemoteFile | None:
        """The projector (`mmproj*.gguf`) beside `model` in `repo`, at the commit the model was listed at; None when
        there is none (see `pick_projector`)."""
        return pick_projector(self.list_gguf_files(repo, model[0].revision), model)

    # -- download -----------------------------------------------------------------------------------------------

    def download(self, repo: str, file: RemoteFile, dest_dir: Path, progress: Progress | None = None,
                 cancel: threading.Event | None = None) -> Path:
        """Download `file` to `dest_dir/<file.path>`, resuming `<that>.incomplete` when present, and verify it.

        Raises ChecksumMismatch (bad file deleted), DownloadCancelled (partial kept), HubUnavailable (partial
        kept), NotFoundOnHub, HubAccessDenied, HubError (among them: another download of this file is running).
        Every HubError raised here carries `partial_bytes`, what is kept for the next attempt.
        """
        final = _destination(dest_dir, file)
        partial = final.with_name(final.name + ".incomplete")
        if _present(final, file):
            _report(progress, file.size, file.size)
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        with _claimed(partial, repo, file) as out:
            try:
                if _present(final, file):  # another download finished between the check above and this claim
                    partial.unlink()
                    _report(progress, file.size, file.size)
                    return final
                final.unlink(missing_ok=True)
                digest = _Digest(file)
                have = os.fstat(out.fileno()).st_size
                if have > file.size:
                    out.truncate(0)
                    have = 0
                digest.update_from(partial)
                if have < file.size:
                    self._fetch(repo, file, out, have, digest, progress, cancel)
                else:
                    _report(progress, have, file.size)
                actual = digest.hexdigest()
                if actual != digest.expected:
                    raise ChecksumMismatch(repo, file.path, f"{digest.kind} {digest.expected}",
                                           f"{digest.kind} {actual}")
            except ChecksumMismatch:
                partial.unlink(missing_ok=True)  # wrong bytes are never resumed from, nor left to be used
                raise
            except HubError as e:
                out.flush()
                e.partial_bytes = os.fstat(out.fileno()).st_size
                if e.partial_bytes == 0:
                    partial.unlink(missing_ok=True)
                raise
            # The final name promises verified bytes (see _present), so they reach the disk before the name does.
            out.flush()
            os.fsync(out.fileno())
            os.replace(partial, final)
        return final

    def _fetch(self, repo: str, file: RemoteFile, out: BinaryIO, have: int, digest: _Digest,
               progress: Progress | None, cancel: threading.Event | None) -> None:
        """One attempt: HEAD for the location, then GET from byte `have` on, appending to `out` and `digest`."""
        _check_cancel(cancel, repo, file, have)
        url = hf_hub_url(repo, file.path, revision=file.revision, endpoint=self.endpoint)
        with self._translated(repo, file.path, file.revision):
            meta = get_hf_file_metadata(url, token=self._token, timeout=self.timeout_s, endpoint=self.endpoint,
                                        library_name="blazar")
        if meta.size not in (None, file.size) or (
                file.sha256 and meta.etag and _SHA256.match(meta.etag) and meta.etag != file.sha256):
            raise HubError(f"{repo}/{file.path} changed on the hub since it was listed (now {meta.etag}, "
                           f"{meta.size} bytes); resolve it again", repo=repo, filename=file.path)
        headers = self._headers(to=meta.location)
        if have:
            headers["Range"] = f"bytes={have}-"
        with self._translated(repo, file.path, file.revision), get_session().stream(
                "GET", meta.location, headers=headers, timeout=self.timeout_s) as resp:
            hf_raise_for_status(resp)
            if have and resp.status_code == 200:
                # The server ignored the Range: what it sends is the whole file, so the partial starts over.
                out.truncate(0)
                have = 0
                digest.reset()
            elif have and not resp.headers.get("Content-Range", "").startswith(f"bytes {have}-"):
                raise HubError(f"{repo}/{file.path}: asked for bytes {have}- and got "
                               f"{resp.headers.get('Content-Range')!r}", repo=repo, filename=file.path)
            done = have
            _report(progress, done, file.size)
            for chunk in resp.iter_bytes(self.chunk_bytes):
                if done + len(chunk) > file.size:
                    raise ChecksumMismatch(repo, file.path, f"{file.size} bytes", f"more than {file.size} bytes")
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                _report(progress, done, file.size)
                _check_cancel(cancel, repo, file, done)
        if done < file.size:
            raise HubUnavailable(f"{repo}/{file.path}: the hub ended the download at {done} of {file.size} bytes",
                                 repo=repo, filename=file.path)

    # -- reading without downloading ----------------------------------------------------------------------------

    def file_size(self, repo: str, filename: str, revision: str = "main") -> int:
        """The size of `filename` in bytes, from one HEAD request."""
        url = hf_hub_url(repo, filename, revision=revision, endpoint=self.endpoint)
        with self._translated(repo, filename, revision):
            meta = get_hf_file_metadata(url, token=self._token, timeout=self.timeout_s, endpoint=self.endpoint,
                                        library_name="blazar")
        if meta.size is None:
            raise HubError(f"{self.endpoint} gave no size for {repo}/{filename}", repo=repo, filename=filename)
        return meta.size

    def fetch_range(self, repo: str, filename: str, start: int, end: int, revision: str = "main") -> bytes:
        """Bytes [start, end) of `filename` (fewer where the file ends first), from one ranged GET; for reading a
        GGUF header before deciding to download the file."""
        if start < 0 or end <= start:
            raise ValueError(f"empty or negative range [{start}, {end})")
        url = hf_hub_url(repo, filename, revision=revision, endpoint=self.endpoint)
        # The session follows the hub's redirect to its CDN; httpx2 drops Authorization when the origin changes.
        headers = self._headers(to=url) | {"Range": f"bytes={start}-{end - 1}"}
        want = end - start
        with self._translated(repo, filename, revision), get_session().stream(
                "GET", url, headers=headers, timeout=self.timeout_s) as resp:
            if resp.status_code == 416:
                return b""
            hf_raise_for_status(resp)
            skip = start if resp.status_code == 200 else 0  # a server that ignores Range sends from byte 0
            buf = bytearray()
            for chunk in resp.iter_bytes(min(self.chunk_bytes, skip + want)):
                buf += chunk
                if len(buf) >= skip + want:
                    break
            return bytes(buf[skip:skip + want])

    # -- plumbing -----------------------------------------------------------------------------------------------

    def _headers(self, to: str) -> dict[str, str]:
        """The client's headers (user agent, token); the token only goes to the endpoint's own origin."""
        token = self._token if _origin(to) == _origin(self.endpoint) else False
        headers = build_hf_headers(token=token, library_name="blazar")
        headers["Accept-Encoding"] = "identity"  # sizes and offsets are the file's own, never a compressed body's
        return headers

    @contextmanager
    def _translated(self, repo: str, filename: str | None = None, revision: str = "main") -> Iterator[None]:
        """huggingface_hub's and httpx2's errors, as Blazar's: each names the repo and the file."""
        what = f"{repo}/{filename}" if filename else repo
        where: dict[str, Any] = {"repo": repo, "filename": filename}
        try:
            yield
        except GatedRepoError as e:  # before RepositoryNotFoundError, its parent
            hint = "the token has no access to it" if self.has_token else "set HF_TOKEN to a token with access"
            raise HubAccessDenied(f"{what} is gated on {self.endpoint}: {hint}", **where) from e
        except RepositoryNotFoundError as e:
            hint = "" if self.has_token else " (a private or gated repo needs HF_TOKEN)"
            raise NotFoundOnHub(f"no repository {repo!r} on {self.endpoint}{hint}", **where) from e
        except RevisionNotFoundError as e:
            raise NotFoundOnHub(f"no revision {revision!r} in {repo} on {self.endpoint}", **where) from e
        except RemoteEntryNotFoundError as e:
            raise NotFoundOnHub(f"no file {filename!r} in {repo} at {revision} on {self.endpoint}", **where) from e
        except HfHubHTTPError as e:
            status = e.response.status_code
            first = str(e).strip().splitlines()[0] if str(e).strip() else f"HTTP {status}"
            if status in (401, 403):
                raise HubAccessDenied(f"{self.endpoint} refused {what} ({status}): {first}", **where) from e
            if status >= 500 or status in (408, 429):
                raise HubUnavailable(f"{self.endpoint} failed on {what} ({status}): {first}", **where) from e
            raise HubError(f"{self.endpoint} refused {what} ({status}): {first}", **where) from e
        except (httpx2.TransportError, OfflineModeIsEnabled) as e:
            raise HubUnavailable(f"{self.endpoint} unreachable for {what}: {type(e).__name__}: {e}", **where) from e
        except HFValidationError as e:
            raise HubError(f"{what!r} is not a valid hub repo id or path: {e}", **where) from e
        except FileMetadataError as e:
            raise HubError(f"{self.endpoint} answered for {what} without the hub's file headers; is it a Hugging "
                           f"Face hub endpoint? ({e})", **where) from e


class _Digest:
    """What a download is checked against: the LFS sha256, else the git blob sha1, else the size alone."""

    def __init__(self, file: RemoteFile) -> None:
        self._file = file
        self.kind = "sha256" if file.sha256 else "git-sha1" if file.blob_id else "size"
        self.expected = file.sha256 or file.blob_id or str(file.size)
        self.reset()

    def reset(self) -> None:
        self._size = 0
        self._h = (hashlib.sha256() if self.kind == "sha256"
                   else hashlib.sha1(b"blob %d\0" % self._file.size) if self.kind == "git-sha1" else None)

    def update(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._h is not None:
            self._h.update(chunk)

    def update_from(self, path: Path) -> None:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                self.update(block)

    def hexdigest(self) -> str:
        return self._h.hexdigest() if self._h is not None else str(self._size)


def _repos(resp: httpx2.Response, endpoint: str) -> list[RemoteRepo]:
    """The repos of one page of /api/models; anything else is a HubError (an endpoint that is not a hub)."""
    try:
        items = resp.json()
    except ValueError:
        items = None
    if not isinstance(items, list) or not all(isinstance(i, dict) and isinstance(i.get("id"), str) for i in items):
        raise HubError(f"{endpoint} answered /api/models without a list of models; is it a Hugging Face hub endpoint?")

    def count(v: object) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    return [RemoteRepo(i["id"], count(i.get("downloads")), count(i.get("likes"))) for i in items]


def gguf_models(files: list[RemoteFile]) -> list[RemoteModel]:
    """The models among a repo's GGUF files (projectors left out), split parts together, in path order."""
    out = []
    for group in _group([f for f in files if not _is_projector(f)]):
        quants = _QUANT.findall(group[0].name)
        m = _SPLIT.match(group[0].path)
        complete = m is None or {int(s["part"]) for f in group if (s := _SPLIT.match(f.path))} == set(
            range(1, int(m["parts"]) + 1))
        out.append(RemoteModel(tuple(group), quants[-1].upper() if quants else None, complete))
    return out


def available_quants(files: list[RemoteFile]) -> list[str]:
    """The quant names that appear in the files' paths, upper-cased and sorted ("Q4_K_M", "Q8_0", "F16")."""
    return sorted({m.upper() for f in files if not _is_projector(f) for m in _QUANT.findall(f.path)})


def _quant_matches(files: list[RemoteFile], quant: str) -> list[RemoteFile]:
    # Whole-token match: "Q4_K" must not pick "Q4_K_M" files, nor "Q4_K_M" pick "IQ4_K_M" ones.
    token = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(quant)}(?![A-Za-z0-9_])", re.IGNORECASE)
    return [f for f in files if token.search(f.path) and not _is_projector(f)]


def pick_projector(files: list[RemoteFile], model: list[RemoteFile]) -> RemoteFile | None:
    """Of the projectors in the model's directory: the one in the model's own precision (a Q8_0 model, an
    mmproj-...-Q8_0), else F16 (what converters write by default), else the first by path."""
    where = PurePosixPath(model[0].path).parent
    found = sorted((f for f in files if _is_projector(f) and PurePosixPath(f.path).parent == where),
                   key=lambda f: f.path)
    if not found:
        return None
    own = {m.upper() for m in _QUANT.findall(model[0].name)}
    for wanted in (own, {"F16"}):
        match = [f for f in found if {m.upper() for m in _QUANT.findall(f.name)} & wanted]
        if match:
            return match[0]
    return found[0]


def _is_projector(file: RemoteFile) -> bool:
    return file.name.lower().startswith("mmproj")  # a vision projector ships beside the model, it is not one


def _group_key(file: RemoteFile) -> str:
    m = _SPLIT.match(file.path)
    return m["stem"].lower() if m else file.path.lower()


def _group(files: list[RemoteFile]) -> list[list[RemoteFile]]:
    groups: dict[str, list[RemoteFile]] = {}
    for f in files:
        groups.setdefault(_group_key(f), []).append(f)
    return [sorted(g, key=lambda f: f.path) for _, g in sorted(groups.items())]


def _complete(repo: str, group: list[RemoteFile]) -> list[RemoteFile]:
    """A split model needs every part: refuse one with parts missing rather than pull a model that cannot load."""
    m = _SPLIT.match(group[0].path)
    if m is None:
        return group
    parts = int(m["parts"])
    present = {int(s["part"]) for f in group if (s := _SPLIT.match(f.path))}
    missing = sorted(set(range(1, parts + 1)) - present)
    if missing:
        raise NotFoundOnHub(f"{repo}: {m['stem']} is split in {parts} parts but parts {missing} are not there",
                            repo=repo, filename=group[0].path)
    return group


def _destination(dest_dir: Path, file: RemoteFile) -> Path:
    rel = PurePosixPath(file.path)
    if rel.is_absolute() or not rel.parts or any(p in ("", ".", "..") for p in rel.parts):
        raise HubError(f"refusing a hub path that leaves the download directory: {file.path!r}", filename=file.path)
    return dest_dir.joinpath(*rel.parts)


def _present(final: Path, file: RemoteFile) -> bool:
    # NOTE: only verified bytes are ever renamed to the final name, so a present file's size is re-checked, not its
    # hash (that would read gigabytes on every pull of a model already there).
    return final.is_file() and final.stat().st_size == file.size


@contextmanager
def _claimed(partial: Path, repo: str, file: RemoteFile) -> Iterator[BinaryIO]:
    """The partial file, open for appending and locked: two pulls of one file (the CLI and the daemon, two threads)
    appending to it at once would interleave their bytes."""
    out = partial.open("ab")
    try:
        try:
            fcntl.flock(out.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HubError(f"{repo}/{file.path} is already being downloaded into {partial.parent}", repo=repo,
                           filename=file.path, partial_bytes=os.fstat(out.fileno()).st_size) from None
        yield out
    finally:
        out.close()


def _check_cancel(cancel: threading.Event | None, repo: str, file: RemoteFile, done: int) -> None:
    if cancel is not None and cancel.is_set():
        raise DownloadCancelled(repo, file.path, done)


def _report(progress: Progress | None, done: int, total: int) -> None:
    if progress is not None:
        progress(done, total)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


def _listing(names: list[str], limit: int = 20) -> str:
    if not names:
        return "none"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
