"""The catalog projection, fed model events: what is in the store and how each model's last pull went."""

from __future__ import annotations

from blazar.events.models import (
    ModelImported,
    ModelMetadata,
    ModelPullCompleted,
    ModelPullFailed,
    ModelPullStarted,
    ModelRemoved,
    ModelTemplateProbed,
    ShardFile,
    TemplateTrial,
)
from blazar.projections import CatalogProjection, fold
from blazar.projections.catalog import CatalogState, Pull, StoredModel, stored
from blazar.projections.catalog import _find as find
from tests.support.catalog import META, imported
from tests.support.events import rec
from tests.support.states import through_checkpoint


def test_an_import_adds_the_model_with_its_file_hash_source_and_metadata() -> None:
    state = fold(CatalogProjection(), [rec(1, imported("tiny:q8", source_kind="file"))])
    assert state == CatalogState(models={"tiny:q8": StoredModel(
        name="tiny:q8", file="tiny--q8.gguf", bytes=100, sha256="ab" * 32, source="/src/tiny:q8.gguf",
        source_kind="file", linked=True, added_ts=1001.0, seq=1, metadata=META, parts=(), kind="llama-server")})
    assert state == through_checkpoint(CatalogProjection(), state)


def _probed(name: str, sha256: str, chosen: str) -> ModelTemplateProbed:
    return ModelTemplateProbed(name=name, sha256=sha256, engine_tag="b1", prompts=5, max_tokens=16, chosen=chosen,
                               trials=[TemplateTrial(template="gemma", ended=0, answered=0, tokens=80),
                                       TemplateTrial(template=chosen, ended=5, answered=4, tokens=31)])


def test_a_template_probe_serves_every_model_with_that_file() -> None:
    state = fold(CatalogProjection(), [rec(1, imported("tiny")), rec(2, imported("other", sha256="cd" * 32)),
                                       rec(3, _probed("tiny", "ab" * 32, "transcript"))])
    probe = stored(state, "tiny").template_probe
    assert probe is not None and (probe.chosen, probe.seq, probe.prompts, probe.max_tokens) == ("transcript", 3, 5, 16)
    assert [(t.template, t.answered, t.tokens) for t in probe.trials] == [("gemma", 0, 80), ("transcript", 4, 31)]
    assert stored(state, "other").template_probe is None
    # A later import of the same file (another name) is served by the same choice; a later probe replaces it.
    state = fold(CatalogProjection(), [rec(4, imported("again")), rec(5, _probed("again", "ab" * 32, "chatml"))],
                 state)
    assert stored(state, "tiny").template_probe.chosen == "chatml"  # type: ignore[union-attr]
    assert stored(state, "again").to_json()["template_probe"]["chosen"] == "chatml"


def test_a_split_import_keeps_every_shard_in_order() -> None:
    shards = [ShardFile(path=f"big/big-0000{i}-of-00002.gguf", bytes=50, sha256=f"{i}" * 64) for i in (1, 2)]
    state = fold(CatalogProjection(), [rec(1, imported("big", path=shards[0].path, shards=shards))])
    entry = state.models["big"]
    assert entry.file == "big/big-00001-of-00002.gguf"
    assert entry.parts == tuple(shards) and entry.shards == tuple(s.path for s in shards)


def test_a_removal_drops_the_model_and_a_reimport_brings_it_back_newer() -> None:
    p = CatalogProjection()
    state = fold(p, [rec(1, imported("a")), rec(2, imported("b")), rec(3, ModelRemoved(name="a", path="a.gguf",
                                                                                         file_deleted=True))])
    assert sorted(state.models) == ["b"]
    state = fold(p, [rec(4, imported("a", sha256="cd" * 32))], state)
    assert state.models["a"].sha256 == "cd" * 32 and state.models["a"].seq == 4


def test_removing_an_unknown_model_changes_nothing() -> None:
    p = CatalogProjection()
    before = fold(p, [rec(1, imported("a"))])
    after = fold(p, [rec(2, ModelRemoved(name="ghost", path="ghost.gguf", file_deleted=False))],
                 fold(p, [rec(1, imported("a"))]))
    assert after == before


def test_a_pull_runs_then_completes() -> None:
    p = CatalogProjection()
    state = fold(p, [rec(1, ModelPullStarted(target="org/tiny-GGUF", name="tiny:q4_k_m", source_kind="hub",
                                             repo="org/tiny-GGUF", files=["tiny-Q4_K_M.gguf"], total_bytes=100))])
    assert state.pulls["tiny:q4_k_m"] == Pull(target="org/tiny-GGUF", status="running", started_ts=1001.0,
                                              total_bytes=100, seq=1)
    assert state.models == {}
    state = fold(p, [
        rec(2, imported("tiny:q4_k_m", source="org/tiny-GGUF", source_kind="hub")),
        rec(3, ModelPullCompleted(target="org/tiny-GGUF", name="tiny:q4_k_m", bytes=100, sha256="ab" * 32,
                                  duration_ms=1500, downloaded_bytes=100)),
    ], state)
    pull = state.pulls["tiny:q4_k_m"]
    assert (pull.status, pull.bytes, pull.duration_ms, pull.ended_ts) == ("completed", 100, 1500, 1003.0)
    assert pull.started_ts == 1001.0  # the start is kept beside the outcome
    assert state.models["tiny:q4_k_m"].source_kind == "hub"


def test_a_failed_pull_keeps_its_reason_and_partial_bytes_and_adds_no_model() -> None:
    state = fold(CatalogProjection(), [
        rec(1, ModelPullStarted(target="org/big", name="big:q4_k_m", source_kind="hub", total_bytes=5000)),
        rec(2, ModelPullFailed(target="org/big", name="big:q4_k_m", reason="cancelled", detail="cancelled by the user",
                               partial_bytes=2048)),
    ])
    assert state.models == {}
    pull = state.pulls["big:q4_k_m"]
    assert (pull.status, pull.reason, pull.partial_bytes, pull.ended_ts) == ("failed", "cancelled", 2048, 1002.0)


def test_a_failure_without_a_start_is_still_recorded() -> None:
    # A pull can fail before it starts downloading (no such quant on the hub): its failure stands alone.
    state = fold(CatalogProjection(), [
        rec(1, ModelPullFailed(target="org/tiny-GGUF:Q5_K_M", name="tiny:q5_k_m", reason="not_found",
                               detail="no Q5_K_M file")),
    ])
    assert state.pulls["tiny:q5_k_m"] == Pull(target="org/tiny-GGUF:Q5_K_M", status="failed", ended_ts=1001.0,
                                              reason="not_found", detail="no Q5_K_M file", partial_bytes=0)


def test_a_retry_after_a_failure_runs_again_and_completes() -> None:
    state = fold(CatalogProjection(), [
        rec(1, ModelPullStarted(target="t/r", name="r:q4_k_m", source_kind="hub")),
        rec(2, ModelPullFailed(target="t/r", name="r:q4_k_m", reason="network", detail="dropped", partial_bytes=10)),
        rec(3, ModelPullStarted(target="t/r", name="r:q4_k_m", source_kind="hub", resumed_from_bytes=10)),
    ])
    assert state.pulls["r:q4_k_m"].status == "running" and state.pulls["r:q4_k_m"].reason is None
    state = fold(CatalogProjection(), [
        rec(4, ModelPullCompleted(target="t/r", name="r:q4_k_m", bytes=20, sha256="ab" * 32, duration_ms=5,
                                  downloaded_bytes=10)),
    ], state)
    assert state.pulls["r:q4_k_m"].status == "completed"


def test_find_takes_an_exact_name_or_the_latest_tag() -> None:
    state = fold(CatalogProjection(), [rec(1, imported("tiny:latest")), rec(2, imported("tiny:q8"))])
    assert find(state, "tiny:q8").seq == 2  # type: ignore[union-attr]
    assert find(state, "tiny").name == "tiny:latest"  # type: ignore[union-attr]
    assert find(state, "tiny:q4") is None
    assert find(state, "other") is None


def test_aliases_resolve_and_die_with_their_model() -> None:
    from blazar.events.models import ModelAliased, ModelAliasRemoved, ModelRemoved
    from blazar.projections.catalog import CatalogProjection
    from blazar.projections.catalog import _find as find

    proj = CatalogProjection()
    state = fold(proj, [rec(1, imported("gemma")), rec(2, imported("qwen:latest"))])

    state = proj.apply(state, rec(3, ModelAliased(alias="gpt-4o", target="gemma")))
    state = proj.apply(state, rec(4, ModelAliased(alias="chat:latest", target="qwen:latest")))
    assert find(state, "gpt-4o").name == "gemma"  # type: ignore[union-attr]
    # `name` means `name:latest`, for aliases too
    assert find(state, "chat").name == "qwen:latest"  # type: ignore[union-attr]
    state = proj.apply(state, rec(5, ModelAliasRemoved(alias="chat:latest", target="qwen:latest")))
    assert find(state, "chat") is None
    state = proj.apply(state, rec(6, ModelRemoved(name="gemma", path="gemma.gguf", file_deleted=True)))
    assert find(state, "gpt-4o") is None and state.aliases == {}


def test_an_import_without_a_kind_is_a_llama_server_model_and_a_whisper_import_keeps_its_kind_and_files() -> None:
    files = [ShardFile(path=f"whisper-base/{f}", bytes=10, sha256=f"{i}" * 64)
             for i, f in enumerate(("model.bin", "config.json", "tokenizer.json", "vocabulary.txt"))]
    old = {k: v for k, v in imported("old").model_dump(mode="json").items() if k != "kind"}  # a log from before kinds
    state = fold(CatalogProjection(), [
        rec(1, ModelImported.model_validate(old)),
        rec(2, imported("whisper-base", path=files[0].path, shards=files, kind="whisper",
                        metadata=ModelMetadata(architecture="whisper"))),
    ])
    assert stored(state, "old") is not None and stored(state, "old").kind == "llama-server"  # type: ignore[union-attr]
    whisper = stored(state, "whisper-base")
    assert whisper is not None and whisper.kind == "whisper" and not whisper.gguf
    assert whisper.files == tuple(f.path for f in files)
    assert whisper.to_json()["kind"] == "whisper"
