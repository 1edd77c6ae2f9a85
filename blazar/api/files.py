"""OpenAI's `/v1/files`: upload (multipart, written to the content store as it arrives), list, retrieve, content,
delete. Each file is its key's (keys are tenants): another key's is 404. The log records the file's id, owner, name,
purpose, size and sha256 (`file.uploaded`, `file.deleted`), never its content (blazar/store/files.py holds that).

Purposes: `batch` (a batch's input) and `user_data` are stored; the others OpenAI defines (fine-tuning, assistants,
vision, evals) are for APIs Blazar does not have, and refused with a 400 that says so. `batch_output` is Blazar's
own (a batch's output and error files).

An upload is a request of its key's (blazar/api/charges.py): before a byte of its body is read it counts against
the key's rpm and takes its concurrency lease (429), and the key's storage must have room (413); the body is
written to disk only up to what is left of the quota, and the file is kept only if it still fits once whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import falcon
import falcon.asgi
from falcon.media.multipart import MultipartParseError

from blazar.api.auth import Access, principal_of
from blazar.api.charges import Charges
from blazar.api.routes import Op, Route
from blazar.api.schemas import INT, OBJ, STR, listed, obj
from blazar.config import Settings
from blazar.context import Blazar, stamp_node
from blazar.errors import DialectError, FileTooLarge
from blazar.events.base import Event, Recorded
from blazar.events.batches import FileDeleted, FileUploaded
from blazar.queries.batches import FileRow, file_json, own_file, own_files
from blazar.serving.principal import Principal
from blazar.store.files import FileStore, Writing, new_file_id

if TYPE_CHECKING:
    pass

STORED_PURPOSES = ("batch", "user_data")
OTHER_PURPOSES = ("assistants", "fine-tune", "vision", "evals")
MAX_FILENAME = 255
CHUNK = 1 << 20
# A multipart body is its file plus the form's boundaries and small fields: what the body bound allows beyond it.
FORM_OVERHEAD = 64 << 10


def path_limits(settings: Settings) -> dict[str, int]:
    """The body bound of the upload route (the middleware's, before routing): the file bound, not max_body_mib."""
    return {"/v1/files": settings.inputs.files_max_bytes + FORM_OVERHEAD}


def owner_of(principal: Principal | None) -> str:
    """Whose files and batches a caller's are: its key's ("key:<name>"), or "" for the machine's owner (auth off, or
    the CLI's admin token)."""
    return f"key:{principal.key.name}" if principal is not None and principal.key is not None else ""


async def record(app: Blazar, events: list[Event], principal: Principal | None) -> list[Recorded]:
    """Control events, durable before the answer, as the caller."""
    events = [stamp_node(e, app.node) for e in events] if app.node else events
    recorded = await app.log.append(events, actor=principal.actor if principal is not None else app.actor)
    await app.runner.catch_up()
    return recorded


def not_found(kind: str, ident: str) -> falcon.HTTPNotFound:
    return falcon.HTTPNotFound(description=f"No such {kind} object: {ident[:80]}")


def _owned(app: Blazar, file_id: str, principal: Principal | None) -> FileRow:
    """The caller's own file by id, or the 404 another key's (or none) gets."""
    row = own_file(app, file_id, owner_of(principal))
    if row is None:
        raise not_found("File", file_id)
    return row


def _filename(name: str | None) -> str:
    """The name the client gave, kept as a label only (it never becomes a path): one line, bounded."""
    text = "".join(c for c in (name or "upload") if c.isprintable())
    return text[:MAX_FILENAME] or "upload"


class Files:
    multipart = True  # the edge lets this route's forms through (blazar/api/edge.py)

    def __init__(self, app: Blazar, store: FileStore, charges: Charges) -> None:
        self.app, self.store, self.charges = app, store, charges

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        if req.content_type is None or not req.content_type.startswith("multipart/form-data"):
            raise DialectError("upload a file as multipart/form-data with the fields `file` and `purpose`",
                               code="invalid_request")
        principal = principal_of(req)
        with self.charges.lease(req, principal, "/v1/files"):  # the key's rpm and concurrency, first
            resp.media = await self._upload(req, principal)

    async def _upload(self, req: falcon.asgi.Request, principal: Principal | None) -> dict[str, Any]:
        owner = owner_of(principal)
        room = self.charges.storage(owner, principal)
        if room.room == 0:  # nothing of the body is read: the quota is full
            self.charges.refuse(req, principal, "/v1/files", room.refusal("no file fits"), Connection="close")
        files_max = self.app.settings().inputs.files_max_bytes
        limit = files_max if room.room is None else min(files_max, room.room)
        form: Any = await req.get_media()
        purpose: str | None = None
        filename: str | None = None
        writing: Writing | None = None
        try:
            async for part in form:
                if part.name == "purpose":
                    purpose = (await part.get_text() or "").strip()
                elif part.name == "file" and writing is None:
                    filename = _filename(part.filename)
                    writing = self.store.writing(limit)
                    async for chunk in part.stream:
                        await asyncio.to_thread(writing.write, chunk)
            if writing is None:
                raise DialectError("the form has no `file` part", code="invalid_request")
            if purpose is None:
                raise DialectError("the form has no `purpose` field", code="invalid_request")
            if purpose not in STORED_PURPOSES:
                why = "is for an API Blazar does not have" if purpose in OTHER_PURPOSES else "is not one OpenAI defines"
                raise DialectError(f"purpose {purpose[:40]!r} {why}; Blazar stores files for "
                                   f"{' and '.join(STORED_PURPOSES)}", code="invalid_request")
            # NOTE: checked again now, and held until recorded: another upload (or a batch line) of the key may have
            # taken room while this one arrived. No await between the check and the hold.
            now = self.charges.storage(owner, principal)
            if not now.fits(writing.bytes):
                self.charges.refuse(req, principal, "/v1/files",
                                    now.refusal(f"this file of {writing.bytes} bytes does not fit", writing.bytes))
            file_id = new_file_id()
            with self.charges.ledger.holding_bytes(owner, writing.bytes):
                stored = await asyncio.to_thread(writing.keep, file_id)
                await record(self.app, [FileUploaded(file_id=file_id, owner=owner, filename=filename or "",
                                                     purpose="batch" if purpose == "batch" else "user_data",
                                                     bytes=stored.bytes, sha256=stored.sha256)], principal)
        except FileTooLarge as e:
            if writing is not None and limit < files_max:  # the quota's room, not files_max_bytes, ended it
                self.charges.refuse(req, principal, "/v1/files", self.charges.storage(owner, principal).refusal(
                    f"this file, more than {limit} bytes, does not fit", writing.bytes), Connection="close")
            raise falcon.HTTPContentTooLarge(description=str(e), headers={"Connection": "close"}) from None
        except MultipartParseError as e:
            raise DialectError(f"the multipart form is malformed: {e.description}", code="invalid_request") from None
        finally:
            if writing is not None:
                writing.discard()
        row = own_file(self.app, file_id, owner)
        assert row is not None
        return file_json(row)

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        purpose = req.get_param("purpose")
        order = req.get_param("order") or "desc"
        if order not in ("asc", "desc"):
            raise DialectError("order must be asc or desc", code="invalid_request")
        limit = req.get_param_as_int("limit", min_value=1, max_value=10_000) or 10_000
        rows = own_files(self.app, owner_of(principal_of(req)))
        if purpose:
            rows = [r for r in rows if r.purpose == purpose]
        if order == "desc":
            rows.reverse()
        after = req.get_param("after")
        if after:
            ids = [r.file_id for r in rows]
            rows = rows[ids.index(after) + 1:] if after in ids else []
        page = rows[:limit]
        data = [file_json(r) for r in page]
        resp.media = {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                      "last_id": data[-1]["id"] if data else None, "has_more": len(rows) > limit}


class File:
    def __init__(self, app: Blazar, store: FileStore) -> None:
        self.app, self.store = app, store

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, file_id: str) -> None:
        resp.media = file_json(_owned(self.app, file_id, principal_of(req)))

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, file_id: str) -> None:
        principal = principal_of(req)
        row = _owned(self.app, file_id, principal)
        await record(self.app, [FileDeleted(file_id=file_id, owner=row.owner)], principal)
        await asyncio.to_thread(self.store.remove_file, file_id)
        resp.media = {"id": file_id, "object": "file", "deleted": True}


class FileContent:
    def __init__(self, app: Blazar, store: FileStore) -> None:
        self.app, self.store = app, store

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, file_id: str) -> None:
        row = _owned(self.app, file_id, principal_of(req))
        path = self.store.open_file(file_id)  # confined to the store's directory, checked now
        try:
            handle = await asyncio.to_thread(path.open, "rb")
        except FileNotFoundError:
            raise falcon.HTTPNotFound(description=f"the content of {file_id} is gone from {path.parent}") from None

        async def chunks() -> AsyncIterator[bytes]:
            try:
                while chunk := await asyncio.to_thread(handle.read, CHUNK):
                    yield chunk
            finally:
                handle.close()

        resp.content_type = "application/jsonl" if row.filename.endswith(".jsonl") else "application/octet-stream"
        resp.content_length = row.bytes
        resp.stream = chunks()


def file_store(app: Blazar) -> FileStore:
    return FileStore(app.paths)


FILE = obj(["id", "object", "bytes", "filename", "purpose"], id=STR, object={"const": "file"}, bytes=INT,
           created_at=INT, filename=STR, purpose=STR)
# Each key's own: the handlers show and touch only the caller's (the route is any key's).
ROUTES = (
    Route("/v1/files", Access.KEY, lambda d: Files(d.app, d.shared(file_store), Charges(d.app, d.gateway)), {
        "post": Op("Upload a file (multipart: file, purpose)", FILE, statuses=(400, 413), form=obj(
            ["file", "purpose"], file={"type": "string", "format": "binary"},
            purpose={"enum": ["batch", "user_data"]})),
        "get": Op("The caller's files", listed(), statuses=(400,))}),
    Route("/v1/files/{file_id}", Access.KEY, lambda d: File(d.app, d.shared(file_store)), {
        "get": Op("One file", FILE, statuses=(404,)),
        "delete": Op("Delete a file", OBJ, statuses=(404,))}),
    Route("/v1/files/{file_id}/content", Access.KEY, lambda d: FileContent(d.app, d.shared(file_store)), {
        "get": Op("A file's content", statuses=(404,), ok_types=("application/octet-stream",))}),
)
