"""Schemathesis over every documented operation with keys on (docs/11.SECURITY.md, "A fuzzer over everything"): the
real `blazar serve` (bench/fake_engine.py as its engine, a tiny GGUF as its model), called with no key, with a scoped
key and with an admin key. Before the run a second scoped key leaves its own data behind: an uploaded file, a batch
made from it, a stored response and a session, each carrying a random marker. Every answer, to every caller, is
checked for a 5xx; every answer to the other scoped key, and to no key, for any of that key's data (its marker, its
file, batch and response ids, its session's name), with a third of the generated path parameters aimed at exactly
those ids. At the end the daemon's resident memory is under a bound.

Bounded: a few examples per operation and caller, no shrinking, a timeout on every call. Longer by hand:
`BLAZAR_FUZZ_EXAMPLES=200 .venv/bin/python -m pytest tests/integration/test_keyed_fuzz.py` (docs/11.SECURITY.md)."""

from __future__ import annotations

import io
import json
import os
import secrets
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error

from blazar.api.openapi import document
from blazar.api.table import ROUTES
from tests.support.daemon import wait_for
from tests.support.fake_serving import FakeDaemon, serving_fake
from tests.support.serving import blazar_cli

MODEL = "tiny"
CALL_TIMEOUT_S = 30.0
EXAMPLES = int(os.environ.get("BLAZAR_FUZZ_EXAMPLES", "6"))  # per operation and caller
MEMORY_BOUND_MIB = 1024  # the daemon's resident memory after the run

schema = schemathesis.openapi.from_dict(document(ROUTES))


@dataclass
class Tenants:
    daemon: FakeDaemon
    home: Path
    secrets: dict[str, str]
    marks: dict[str, str]  # what only the key "owner" made: a marker, its ids, its session's name

    def headers(self, caller: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secrets[caller]}"} if caller in self.secrets else {}


def _owners_data(base: str, secret: str, marker: str) -> dict[str, str]:
    """The key's own file, batch, stored response and session, each carrying `marker`."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=secret, max_retries=0, timeout=CALL_TIMEOUT_S,
                           http_client=openai.DefaultHttpxClient(trust_env=False))
    line = {"custom_id": f"line-{marker}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"say {marker}"}], "max_tokens": 2}}
    file_id = client.files.create(file=(f"{marker}.jsonl", io.BytesIO(json.dumps(line).encode() + b"\n")),
                                  purpose="batch").id
    batch_id = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                     completion_window="24h").id
    wait_for(lambda: client.batches.retrieve(batch_id).status in ("completed", "failed"), "the owner's batch",
             timeout=120)
    response_id = client.responses.create(model=MODEL, input=f"remember {marker}", max_output_tokens=2,
                                          store=True).id
    session = f"session-{marker}"
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": marker}], max_tokens=2,
                                   extra_headers={"X-Blazar-Session": session})
    return {"marker": marker, "file_id": file_id, "batch_id": batch_id, "response_id": response_id, "name": session}


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    home, files = tmp_path_factory.mktemp("keyed-fuzz-home"), tmp_path_factory.mktemp("keyed-fuzz-files")
    with serving_fake(home, files, MODEL) as d:
        made: dict[str, str] = {}
        for name, args in (("root", ["--admin"]), ("owner", ["--models", "tiny*"]), ("other", ["--models", "tiny*"])):
            made[name] = json.loads(blazar_cli(home, "keys", "create", name, *args, "--json").stdout)["secret"]
        marks = _owners_data(d.base, made["owner"], secrets.token_hex(12))
        yield Tenants(d, home, made, marks)
        rss_kib = int(next(line.split()[1] for line in Path(f"/proc/{d.proc.pid}/status").read_text().splitlines()
                           if line.startswith("VmRSS:")))
        assert rss_kib < MEMORY_BOUND_MIB << 10, f"the daemon holds {rss_kib >> 10} MiB after the run"
    err = d.stderr()
    assert "Traceback" not in err, err


def aim(case: schemathesis.Case, marks: dict[str, str]) -> None:
    """Bodies name the model that exists; one case in three aims its path parameters at the owner's own ids (chosen
    by a checksum, so a run repeats)."""
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("model"), str):
        body["model"] = MODEL
    params = case.path_parameters or {}
    if params and zlib.crc32(repr(sorted(params.items())).encode(errors="surrogatepass")) % 3 == 0:
        case.path_parameters = {k: marks.get(k, v) for k, v in params.items()}
    if case.operation.path == "/api/blazar/events/follow":  # a live stream: bounded, as a client may
        case.query = {**(case.query or {}), "timeout_s": 0.05}


def _nothing_of(marks: dict[str, str]) -> Any:
    def nothing_of_the_owners(ctx: Any, response: schemathesis.Response, case: schemathesis.Case) -> None:
        text = response.content.decode(errors="replace")
        sent = f"{case.formatted_path} {case.query!r} {case.body!r}"  # an answer may name what it was asked for
        leaked = sorted(k for k, v in marks.items() if v in text and v not in sent)
        assert not leaked, f"{case.method} {case.formatted_path} answered another key's {leaked}: {text[:300]!r}"
    return nothing_of_the_owners


@pytest.mark.parametrize("caller", ["other", "nobody", "root"])
@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
def test_no_caller_gets_a_5xx_nor_another_keys_data(case: schemathesis.Case, tenants: Tenants, caller: str) -> None:
    aim(case, tenants.marks)
    checks: list[Any] = [not_a_server_error]
    if caller != "root":  # the machine's owner may see what its keys made; no other key may
        checks.append(_nothing_of(tenants.marks))
    case.call_and_validate(base_url=tenants.daemon.base, timeout=CALL_TIMEOUT_S, headers=tenants.headers(caller),
                           checks=checks)
