"""Schemathesis against the real `blazar serve` (bench/fake_engine.py as its engine, a tiny GGUF as its model, the
local hub stand-in as its hub): every documented operation of the route table (blazar/api/table.py, rendered by
blazar/api/openapi.py), with generated valid and invalid requests, answers no 5xx, only documented statuses and
media types, and bodies that match their documented schemas (NDJSON streams line by line, SSE event by event).

Bounded: a few examples per operation, no shrinking, a timeout on every call. Nothing is excluded: /api/pull is
served by the hub stand-in, /ready's smoke generation runs on the fake engine."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import httpx2
import jsonschema
import orjson
import pytest
import schemathesis
from gguf.constants import LlamaFileType
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from blazar.api.openapi import document
from blazar.api.table import ROUTES
from tests.support.fake_serving import FakeDaemon, serving_fake
from tests.support.gguf_factory import write_plain
from tests.support.hub_server import HubServer

MODEL = "tiny"
HUB_REPO = "org/tiny-GGUF"
CALL_TIMEOUT_S = 30.0
NDJSON = "application/x-ndjson"
EXAMPLES = 25  # per operation, besides the coverage and example phases' own cases

schema = schemathesis.openapi.from_dict(document(ROUTES))


def aim(case: schemathesis.Case) -> None:
    """The document's examples, and two generated requests in three, name a model that exists (or, for /api/pull,
    one the hub has), so they get past model resolution to the engine; chosen by the body's checksum, so a run
    repeats. /api/delete keeps its generated names, so the model stays for the rest of the run."""
    if case.operation.path == "/api/blazar/events/follow":  # a live stream: bounded, as a client may (the shortest
        case.query = {**(case.query or {}), "timeout_s": 0.05}  # it takes: each case of this route waits it out)
    body = case.body
    if not isinstance(body, dict) or case.operation.path == "/api/delete":
        return
    documented = case.meta is not None and case.meta.phase.name == "examples"
    if not documented and zlib.crc32(repr(body).encode(errors="surrogatepass")) % 3 == 0:
        return
    name = HUB_REPO if case.operation.path == "/api/pull" else MODEL
    for key in ("model", "source"):
        if isinstance(body.get(key), str):
            body[key] = name


def ndjson_lines_conform(ctx: Any, response: schemathesis.Response, case: schemathesis.Case) -> None:
    """Each line of an NDJSON stream against the line schema the document gives (schemathesis reads SSE events
    itself, but has no reader for NDJSON)."""
    if not response.headers.get("content-type", [""])[0].startswith(NDJSON):
        return
    doc = document(ROUTES)
    op = doc["paths"][case.operation.path][case.method.lower()]
    line_schema = op["responses"][str(response.status_code)]["content"][NDJSON]["schema"]
    validator = jsonschema.Draft202012Validator({**line_schema, "components": doc["components"]})
    for n, line in enumerate(response.content.splitlines()):
        errors = [e.message for e in validator.iter_errors(orjson.loads(line))]
        assert not errors, f"NDJSON line {n} does not match its schema: {errors}\n{line[:500]!r}"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeDaemon]:
    repos = tmp_path_factory.mktemp("repos")
    write_plain(repos / "tiny-Q4_K_M.gguf", file_type=LlamaFileType.MOSTLY_Q4_K_M, seed=1)
    home = tmp_path_factory.mktemp("schemathesis-home")
    files = tmp_path_factory.mktemp("schemathesis-files")
    with HubServer({HUB_REPO: {"tiny-Q4_K_M.gguf": repos / "tiny-Q4_K_M.gguf"}}) as hub, \
            serving_fake(home, files, MODEL, env={"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_TOKEN": ""}) \
            as d:
        yield d
    err = d.stderr()
    assert "Traceback" not in err, err


def test_the_daemon_serves_the_document_this_run_uses(daemon: FakeDaemon) -> None:
    r = httpx2.get(f"{daemon.base}/openapi.json", timeout=CALL_TIMEOUT_S, trust_env=False)
    assert r.status_code == 200
    assert r.json() == document(ROUTES)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_document(case: schemathesis.Case, daemon: FakeDaemon) -> None:
    aim(case)
    case.call_and_validate(base_url=daemon.base, timeout=CALL_TIMEOUT_S,
                           checks=[not_a_server_error, status_code_conformance, content_type_conformance,
                                   response_schema_conformance,
                                   ndjson_lines_conform])
