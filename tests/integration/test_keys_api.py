"""API keys end to end: `blazar keys` against a running `blazar serve` with the real llama-server and Gemma, through
the official `openai`, `anthropic` and `ollama` SDKs: 401 without or with a wrong key, 403 outside a key's scope and
on admin routes, 429 with Retry-After for rpm (a key's concurrency lease held by an open stream: test_key_lease.py),
rotate and revoke counting on the very next request, the CLI still working through its admin token, and no secret
in any file under the home."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx2
import ollama
import openai
import pytest

from blazar.bootstrap import bootstrap
from blazar.operations import keys as key_handlers
from tests.support.blazar_home import home_paths, read_events
from tests.support.daemon import wait_for
from tests.support.serving import blazar_cli, serving_gemma

MODEL = "gemma"
CHAT = [{"role": "user", "content": "Hi"}]


class Keyed:
    def __init__(self, home: Path, port: int, proc: subprocess.Popen, open_before_keys: int) -> None:
        self.home, self.port, self.proc = home, port, proc
        self.base = f"http://127.0.0.1:{port}"
        self.open_before_keys = open_before_keys
        self.secrets: dict[str, str] = {}
        self.every_secret: list[str] = []

    def create(self, name: str, *args: str) -> str:
        out = json.loads(blazar_cli(self.home, "keys", "create", name, *args, "--json").stdout)
        self.secrets[name] = out["secret"]
        self.every_secret.append(out["secret"])
        return str(out["secret"])

    def openai(self, key: str | None) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=key or "none", max_retries=0, timeout=120)

    def anthropic(self, key: str | None) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.base, api_key=key or "none", max_retries=0, timeout=120)

    def ollama(self, key: str | None) -> ollama.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return ollama.Client(host=self.base, timeout=120, trust_env=False, headers=headers)

    def http(self, method: str, path: str, key: str | None = None, **kw: object) -> httpx2.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx2.request(method, f"{self.base}{path}", headers=headers, timeout=120, trust_env=False,
                              **kw)  # type: ignore[arg-type]

    def events(self, *types: str) -> list[dict]:
        return read_events(self.home, *types)

    def trace_done(self, trace_id: str) -> dict:
        """Request events are group-committed: wait for the trace's end event."""
        ends = ("request.completed", "request.failed", "request.rejected")
        return wait_for(lambda: next((e for e in self.events(*ends) if e["trace_id"] == trace_id), None),
                        f"the end of {trace_id}", timeout=30)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[Keyed]:
    home = tmp_path_factory.mktemp("keys-home")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": 1024, "slots": 2}) as (port, proc):
        before = httpx2.get(f"http://127.0.0.1:{port}/v1/models", timeout=10, trust_env=False).status_code
        k = Keyed(home, port, proc, before)
        k.create("root", "--admin")
        k.create("user", "--models", "gemma*")
        k.create("other", "--models", "qwen*", "--models", "llama*")
        yield k


def test_without_keys_every_route_was_open_and_with_one_a_key_is_needed(keyed: Keyed) -> None:
    assert keyed.open_before_keys == 200
    r = keyed.http("GET", "/v1/models")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["code"] == "invalid_api_key" and r.json()["error"]["type"] == "authentication_error"
    assert keyed.http("GET", "/health").status_code == 200
    assert keyed.http("OPTIONS", "/v1/chat/completions").status_code != 401


@pytest.mark.parametrize("key", [None, "blz_wrongwrongwrongwrongwrongwrongwrongwrongwro", "sk-not-ours"])
def test_no_key_or_a_wrong_one_is_401_in_each_sdk(keyed: Keyed, key: str | None) -> None:
    # The SDKs insist on a key; "no key" is their header explicitly left out (Omit).
    no_bearer = {"extra_headers": {"Authorization": openai.Omit()}} if key is None else {}
    no_api_key = {"extra_headers": {"x-api-key": anthropic.Omit()}} if key is None else {}
    with pytest.raises(openai.AuthenticationError) as oe:
        keyed.openai(key).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1,  # type: ignore[arg-type]
                                                  **no_bearer)
    assert oe.value.status_code == 401 and oe.value.code == "invalid_api_key"
    with pytest.raises(anthropic.AuthenticationError) as ae:
        keyed.anthropic(key).messages.create(model=MODEL, max_tokens=1, messages=CHAT,  # type: ignore[arg-type]
                                             **no_api_key)
    assert ae.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(ollama.ResponseError) as le:
        keyed.ollama(key).chat(model=MODEL, messages=CHAT)
    assert le.value.status_code == 401 and "key" in le.value.error.lower()


def test_a_wrong_secret_with_a_real_keys_prefix_is_401(keyed: Keyed) -> None:
    real = keyed.secrets["user"]
    forged = real[:12] + ("A" * (len(real) - 12))
    with pytest.raises(openai.AuthenticationError):
        keyed.openai(forged).models.list()


def test_a_good_key_works_in_each_sdk_and_is_the_actor_of_its_requests(keyed: Keyed) -> None:
    key = keyed.secrets["user"]
    raw = keyed.openai(key).chat.completions.with_raw_response.create(model=MODEL, messages=CHAT,  # type: ignore[arg-type]
                                                                     max_tokens=2)
    assert raw.parse().choices[0].message.role == "assistant"
    trace = raw.headers["x-blazar-trace-id"]
    done = keyed.trace_done(trace)
    assert done["type"] == "request.completed" and done["actor"] == "key:user"
    assert {e["actor"] for e in keyed.events() if e["trace_id"] == trace} == {"key:user"}
    msg = keyed.anthropic(key).messages.create(model=MODEL, max_tokens=2, messages=CHAT)  # type: ignore[arg-type]
    assert msg.type == "message"
    answer = keyed.ollama(key).chat(model=MODEL, messages=CHAT, options={"num_predict": 2})
    assert answer.message.role == "assistant"
    assert [m.id for m in keyed.openai(key).models.list()] == [MODEL]
    why = blazar_cli(keyed.home, "why", trace).stdout
    assert "by key:user" in why


def test_a_model_outside_the_keys_scope_is_403_naming_the_scope_and_hidden_from_listings(keyed: Keyed) -> None:
    key = keyed.secrets["other"]
    with pytest.raises(openai.PermissionDeniedError) as oe:
        keyed.openai(key).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)  # type: ignore[arg-type]
    assert oe.value.code == "model_not_allowed" and "qwen*" in oe.value.message and MODEL in oe.value.message
    trace = oe.value.response.headers["x-blazar-trace-id"]
    rejected = keyed.trace_done(trace)
    assert rejected["type"] == "request.rejected" and rejected["data"]["reason"] == "model_not_allowed"
    assert rejected["actor"] == "key:other"
    with pytest.raises(anthropic.PermissionDeniedError):
        keyed.anthropic(key).messages.create(model=MODEL, max_tokens=1, messages=CHAT)  # type: ignore[arg-type]
    with pytest.raises(ollama.ResponseError) as le:
        keyed.ollama(key).generate(model=MODEL, prompt="Hi")
    assert le.value.status_code == 403
    assert list(keyed.openai(key).models.list()) == []
    assert keyed.ollama(key).list().models == []
    with pytest.raises(ollama.ResponseError) as se:
        keyed.ollama(key).show(MODEL)
    assert se.value.status_code == 404
    assert keyed.ollama(keyed.secrets["user"]).show(MODEL).modelinfo
    with pytest.raises(openai.NotFoundError):
        keyed.openai(key).models.retrieve(MODEL)


def test_rpm_is_429_with_retry_after(keyed: Keyed) -> None:
    key = keyed.create("rpm2", "--rpm", "2")
    client = keyed.openai(key)
    for _ in range(2):
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)  # type: ignore[arg-type]
    assert e.value.code == "rate_limit_exceeded" and "rpm" in e.value.message
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 60
    with pytest.raises(anthropic.RateLimitError):
        keyed.anthropic(key).messages.create(model=MODEL, max_tokens=1, messages=CHAT)  # type: ignore[arg-type]


def test_rotate_and_revoke_count_on_the_very_next_request(keyed: Keyed) -> None:
    old = keyed.create("rotating")
    assert keyed.openai(old).models.list()
    new = json.loads(blazar_cli(keyed.home, "keys", "rotate", "rotating", "--json").stdout)["secret"]
    keyed.every_secret.append(new)
    with pytest.raises(openai.AuthenticationError):
        keyed.openai(old).models.list()
    assert [m.id for m in keyed.openai(new).models.list()] == [MODEL]
    blazar_cli(keyed.home, "keys", "revoke", "rotating")
    with pytest.raises(openai.AuthenticationError):
        keyed.openai(new).models.list()


def test_a_key_change_from_another_process_counts_through_the_daemons_live_tail(keyed: Keyed) -> None:
    """No `blazar keys` here (it would ask the daemon to fold at once): the event lands in the log from another
    process, and the daemon's follower (runner.follow) makes it count."""
    secret = keyed.create("quiet")
    assert keyed.openai(secret).models.list()

    async def revoke() -> None:
        app = await bootstrap(paths=home_paths(keyed.home), actor="test:elsewhere")
        try:
            await key_handlers.revoke(app, "quiet")
        finally:
            await app.close()

    asyncio.run(revoke())
    wait_for(lambda: keyed.http("GET", "/v1/models", secret).status_code == 401, "the revoked key refused",
             timeout=10)


def test_an_ollama_load_request_outside_the_scope_is_403(keyed: Keyed) -> None:
    with pytest.raises(ollama.ResponseError) as le:
        keyed.ollama(keyed.secrets["other"]).generate(model=MODEL)  # no prompt: Ollama's "load the model"
    assert le.value.status_code == 403 and "qwen*" in le.value.error


def test_state_shows_the_keys_without_salt_or_hash(keyed: Keyed) -> None:
    state = json.loads(blazar_cli(keyed.home, "state", "--json").stdout)["projections"]["keys"]
    assert state["keys"]["user"]["models"] == ["gemma*"]
    assert all("hash" not in k and "salt" not in k for k in state["keys"].values())


def test_admin_routes_need_an_admin_key(keyed: Keyed) -> None:
    user, root = keyed.secrets["user"], keyed.secrets["root"]
    r = keyed.http("POST", "/api/blazar/load", user, json={"model": MODEL})
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required"
    with pytest.raises(ollama.ResponseError) as le:
        keyed.ollama(user).pull("acme/tiny-GGUF")
    assert le.value.status_code == 403
    assert keyed.http("GET", "/metrics", user).status_code == 403
    r = keyed.http("POST", "/api/blazar/load", root, json={"model": MODEL})
    assert r.status_code == 200, r.text
    ps = keyed.http("GET", "/api/blazar/ps", root).json()["instances"]
    assert ps and all(isinstance(row["port"], int) for row in ps)
    metrics = keyed.http("GET", "/metrics", root).text
    assert 'blazar_key_requests_total{key="user",status="200"}' in metrics
    assert 'blazar_key_tokens_total{key="user",direction="out"}' in metrics


def test_the_cli_keeps_working_with_keys_on(keyed: Keyed) -> None:
    loaded = json.loads(blazar_cli(keyed.home, "load", MODEL, "--json").stdout)
    assert loaded["model"] == MODEL
    ps = json.loads(blazar_cli(keyed.home, "ps", "--json").stdout)
    assert [r["model"] for r in ps["instances"]] == [MODEL]
    answer = json.loads(blazar_cli(keyed.home, "run", MODEL, "Hi", "--max-tokens", "2", "--json",
                                   "--chat").stdout)
    assert answer["object"] == "chat.completion"
    assert blazar_cli(keyed.home, "stop", MODEL).returncode == 0
    token = (keyed.home / "run" / "admin.token")
    assert token.stat().st_mode & 0o777 == 0o600
    usage = {r["name"]: r for r in json.loads(blazar_cli(keyed.home, "keys", "list", "--json").stdout)}
    assert usage["user"]["requests_today"] >= 3 and usage["user"]["tokens_today"] > 0
    assert usage["rotating"]["state"] == "revoked"


def test_best_of_n_counts_each_candidate_against_the_keys_max_concurrent(keyed: Keyed) -> None:
    """Two free slots, but a key allowed one request at a time runs one candidate; a key allowed two runs two."""
    chat = [{"role": "user", "content": "Name a colour."}]
    for name, allowed in (("solo", 1), ("duo", 2)):
        key = keyed.create(name, "--max-concurrent", str(allowed))
        raw = keyed.openai(key).chat.completions.with_raw_response.create(
            model=MODEL, messages=chat, max_tokens=4, extra_headers={"X-Blazar-Best-Of": "4"})  # type: ignore[arg-type]
        assert raw.headers["x-blazar-best-of"] == f"asked=4 used={allowed}"
        # Every candidate's share was given back: the key may run again at once.
        keyed.openai(key).chat.completions.create(model=MODEL, messages=chat, max_tokens=1)  # type: ignore[arg-type]


def test_zz_no_secret_is_in_any_file_under_the_home(keyed: Keyed) -> None:
    """Last in the module: every secret made so far, and the random part of each, in no file (db, WAL included)."""
    assert len(keyed.every_secret) >= 6
    needles = [s.encode() for s in keyed.every_secret] + [s[4:].encode() for s in keyed.every_secret]
    files = [p for p in keyed.home.rglob("*") if p.is_file()]
    assert any(p.name.endswith("-wal") or p.name.endswith(".db") for p in files)
    for path in files:
        data = path.read_bytes()
        for needle in needles:
            assert needle not in data, f"a secret is in {path}"
