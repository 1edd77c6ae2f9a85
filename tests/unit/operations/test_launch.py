"""`blazar launch` without a daemon: the environment it gives the command, the model it picks, the key it mints and
revokes on a real log (through the key handlers: key.* events), and the exit code it passes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from blazar.clock import FakeClock
from blazar.context import Blazar
from blazar.errors import KeyCommandError, ModelNotFound
from blazar.events import Recorded
from blazar.events.models import ModelAliased, ModelImported, ModelMetadata
from blazar.operations import keys, launch
from blazar.projections import CatalogProjection, fold
from blazar.projections.catalog import CatalogState
from blazar.projections.keys import key as api_key

URL = "http://127.0.0.1:11435"


def catalog(*names: str, aliases: dict[str, str] | None = None) -> CatalogState:
    """A store holding `names` (and `aliases`), folded from the events that made it."""
    events = [ModelImported(name=n, path=f"{n}.gguf", source="/src", bytes=1, sha256="ab" * 32, linked=True,
                            metadata=ModelMetadata(architecture="llama")) for n in names]
    events += [ModelAliased(alias=a, target=t) for a, t in (aliases or {}).items()]
    recs = [Recorded(i, 1000.0 + i, e.TYPE, e.V, e.stream_key(), None, "t", None, e) for i, e in enumerate(events, 1)]
    return fold(CatalogProjection(), recs)


# -- the environment ---------------------------------------------------------------------------------------------

def test_env_points_every_sdk_at_the_gateway_with_the_key_and_the_model() -> None:
    env = launch.gateway_env({"PATH": "/bin", "HOME": "/h"}, url=URL, secret="blz_secret", model="gemma")
    assert env["OPENAI_BASE_URL"] == f"{URL}/v1"
    assert env["ANTHROPIC_BASE_URL"] == URL and env["OLLAMA_HOST"] == URL
    assert env["OPENAI_API_KEY"] == env["ANTHROPIC_API_KEY"] == env["OLLAMA_API_KEY"] == "blz_secret"
    assert env["OPENAI_MODEL"] == env["ANTHROPIC_MODEL"] == "gemma"
    assert env["PATH"] == "/bin" and env["HOME"] == "/h"
    assert "SSL_CERT_FILE" not in env and "NO_PROXY" not in env


def test_with_keys_off_the_key_variables_hold_a_placeholder_the_sdks_accept() -> None:
    env = launch.gateway_env({}, url=URL, secret=None, model=None)
    assert env["OPENAI_API_KEY"] == env["ANTHROPIC_API_KEY"] == env["OLLAMA_API_KEY"] == launch.PLACEHOLDER_KEY
    assert launch.PLACEHOLDER_KEY


def test_a_model_and_a_credential_from_the_callers_env_are_not_passed_to_the_gateway() -> None:
    base = {"OPENAI_MODEL": "gpt-4o", "ANTHROPIC_MODEL": "claude", "ANTHROPIC_AUTH_TOKEN": "sk-ant-real",
            "OPENAI_API_KEY": "sk-real", "OPENAI_BASE_URL": "https://api.openai.com/v1"}
    env = launch.gateway_env(base, url=URL, secret=None, model=None)
    assert "OPENAI_MODEL" not in env and "ANTHROPIC_MODEL" not in env and "ANTHROPIC_AUTH_TOKEN" not in env
    assert env["OPENAI_API_KEY"] == launch.PLACEHOLDER_KEY and env["OPENAI_BASE_URL"] == f"{URL}/v1"
    assert base["OPENAI_MODEL"] == "gpt-4o"  # the caller's mapping is left as it was


def test_https_gives_a_ca_bundle_to_python_and_the_daemons_certificate_to_node(tmp_path: Path) -> None:
    env = launch.gateway_env({}, url="https://127.0.0.1:8443", secret="s", model=None,
                             ca_bundle=tmp_path / "bundle.pem", ca_file="/etc/blazar/cert.pem")
    assert env["OPENAI_BASE_URL"] == "https://127.0.0.1:8443/v1" and env["OLLAMA_HOST"] == "https://127.0.0.1:8443"
    assert env["SSL_CERT_FILE"] == env["REQUESTS_CA_BUNDLE"] == str(tmp_path / "bundle.pem")
    assert env["NODE_EXTRA_CA_CERTS"] == "/etc/blazar/cert.pem"


@pytest.mark.parametrize(("url", "host"), [(URL, "127.0.0.1"), ("http://[::1]:9000", "::1")])
def test_a_proxy_in_the_env_is_bypassed_for_the_gateway(url: str, host: str) -> None:
    env = launch.gateway_env({"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "corp.example"}, url=url,
                             secret=None, model=None)
    assert env["NO_PROXY"] == f"corp.example,{host}" and env["no_proxy"] == host


def test_the_ca_bundle_keeps_the_roots_the_command_trusted_and_adds_the_daemons_certificate(tmp_path: Path) -> None:
    roots, cert = tmp_path / "roots.pem", tmp_path / "cert.pem"
    roots.write_text("-----BEGIN CERTIFICATE-----\nROOT\n-----END CERTIFICATE-----\n")
    cert.write_text("-----BEGIN CERTIFICATE-----\nDAEMON\n-----END CERTIFICATE-----\n")
    out = launch.write_ca_bundle(tmp_path / "bundle.pem", str(cert), {"SSL_CERT_FILE": str(roots)})
    text = out.read_text()
    assert text.index("ROOT") < text.index("DAEMON") and text.count("BEGIN CERTIFICATE") == 2


# -- the exit code -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("returncode", "expected"), [(0, 0), (3, 3), (255, 255), (-2, 130), (-15, 143), (-9, 137)])
def test_the_commands_exit_code_is_passed_on_and_a_signal_is_128_plus_its_number(returncode: int,
                                                                                 expected: int) -> None:
    assert launch.exit_code_of(returncode) == expected


# -- the model ---------------------------------------------------------------------------------------------------

def test_the_asked_model_is_resolved_through_the_store_aliases_too() -> None:
    target = launch.pick_model(catalog("gemma:latest", "qwen:7b", aliases={"g": "gemma:latest"}), "g")
    assert target == launch.Target(asked="g", name="gemma:latest")
    assert launch.pick_model(catalog("gemma:latest"), "gemma") == launch.Target("gemma", "gemma:latest")


def test_an_unknown_model_is_refused_with_the_list_command() -> None:
    with pytest.raises(ModelNotFound, match="blazar list"):
        launch.pick_model(catalog("gemma"), "llama")


def test_without_model_the_only_one_is_used_and_with_several_or_none_no_model_is_set() -> None:
    assert launch.pick_model(catalog("gemma"), None) == launch.Target("gemma", "gemma")
    assert launch.pick_model(catalog("gemma", "qwen"), None) is None
    assert launch.pick_model(catalog(), None) is None


# -- the key -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["python", "/usr/bin/python3.11", "./my agent!.sh", "---", "x" * 80])
def test_a_key_name_says_launch_and_the_command_and_is_a_valid_unique_name(command: str) -> None:
    a = launch.key_name(command, now=1_700_000_000.0)
    b = launch.key_name(command, now=1_700_000_000.0)
    assert a.startswith("launch-") and "20231114T221320" in a and a != b
    assert keys.check_name(a) == a


async def test_with_keys_off_no_key_is_minted_so_auth_stays_off(app: Blazar) -> None:
    before = app.runner.state("keys").live
    assert await launch.mint(app, "python", None, expires="1h") is None
    assert app.runner.state("keys").live == before == 0


async def test_with_keys_on_the_key_is_scoped_expiring_and_not_admin_and_revoke_ends_it(app: Blazar,
                                                                                       clock: FakeClock) -> None:
    await keys.create(app, "root", admin=True)
    minted = await launch.mint(app, "/usr/bin/codex", launch.Target("g", "gemma:latest"), expires="2h")
    assert minted is not None and minted.name.startswith("launch-codex-") and minted.secret.startswith("blz_")
    assert minted.created.type == "key.created"
    k = api_key(app.runner.state("keys"), minted.name)
    assert k is not None and not k.admin and k.models == ("gemma:latest",) and not k.revoked
    assert k.expires_ts == clock.now() + 2 * 3600
    rec = await launch.revoke(app, minted.name)
    assert rec.type == "key.revoked"
    revoked = api_key(app.runner.state("keys"), minted.name)
    assert revoked is not None and revoked.revoked


async def test_without_a_model_the_key_may_use_every_model(app: Blazar) -> None:
    await keys.create(app, "root", admin=True)
    minted = await launch.mint(app, "python", None, expires=launch.DEFAULT_EXPIRES)
    assert minted is not None
    k = api_key(app.runner.state("keys"), minted.name)
    assert k is not None and k.models == () and k.expires_ts is not None


@pytest.mark.parametrize("keys_on", [False, True])
async def test_a_bad_expiry_is_refused_before_anything_is_recorded(app: Blazar, keys_on: bool) -> None:
    if keys_on:
        await keys.create(app, "root", admin=True)
    count = len(app.runner.state("keys").keys)
    with pytest.raises(KeyCommandError, match="--expires"):
        await launch.mint(app, "python", None, expires="soon")
    assert len(app.runner.state("keys").keys) == count
