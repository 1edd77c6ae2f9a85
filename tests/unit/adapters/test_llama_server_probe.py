"""Probing llama-server from its real --version and --help outputs, and the argv built from a fit plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from blazar.adapters.engines.llama_server import Capabilities, FlagSpec, build_argv, parse_help, parse_version
from blazar.errors import EngineError, EngineIncompatible
from blazar.fit.planner import FitRequest, plan
from tests.support.fit_models import GiB, gemma3_270m, host

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "llama_server"
BIN, MODEL = Path("/opt/llama-server"), Path("/models/gemma.gguf")


@pytest.fixture(scope="module")
def caps() -> Capabilities:
    return parse_help((FIXTURES / "help.txt").read_text())


def _without(caps: Capabilities, name: str) -> Capabilities:
    return Capabilities(flags=tuple(f for f in caps.flags if name not in f.names))


def _value_of(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_real_version_is_parsed() -> None:
    v = parse_version((FIXTURES / "version.txt").read_text())
    assert (v.version, v.build, v.commit) == ("0.6.0-dev", 0, "unknown")
    assert v.built_with == "GNU 12.2.0 for Linux x86_64"


def test_version_after_backend_log_lines_and_the_older_form() -> None:
    text = "load_backend: loaded CPU backend from libggml-cpu.so\nversion: 4589 (a1b2c3d)\nbuilt with cc for x86_64\n"
    v = parse_version(text)
    assert (v.version, v.build, v.commit, v.built_with) == ("4589", None, "a1b2c3d", "cc for x86_64")


def test_unknown_version_output_is_a_clear_error() -> None:
    with pytest.raises(EngineError, match=r"no 'version: \.\.\.' line.*error: unknown argument"):
        parse_version("error: unknown argument: --version\n")


def test_real_help_lists_the_flags_blazar_needs(caps: Capabilities) -> None:
    ctx = caps.spec("-c")
    assert ctx is not None and ctx.names == ("-c", "--ctx-size") and ctx.metavar == "N"
    assert ctx.env == "LLAMA_ARG_CTX_SIZE"
    assert caps.spec("--parallel") == caps.spec("-np")
    assert {"q8_0", "q4_0", "f16"} <= set(caps.cache_type_k) and caps.cache_type_k == caps.cache_type_v
    assert caps.flash_attn_choices == ("on", "off", "auto")
    assert caps.choices("--rope-scaling") == ("none", "linear", "yarn")
    assert caps.choices("--cpu-strict") == ("0", "1")
    assert caps.spec("-h") is not None and caps.spec("-h").names == ("-h", "--help", "--usage")  # type: ignore[union-attr]
    assert {"--kv-unified", "-no-kvu", "--no-kv-unified", "--metrics", "--slots", "--no-warmup"} <= caps.all_names()
    assert (caps.metrics, caps.slots_endpoint, caps.slot_save_path, caps.kv_unified, caps.no_kv_unified) == (
        True, True, True, True, True)
    assert (caps.no_warmup, caps.no_repack, caps.parallel, caps.threads, caps.verbosity) == (True,) * 5
    assert (caps.mlock, caps.no_mmap) == (False, False)  # this build has --load-mode instead
    assert "mlock" in caps.choices("--load-mode")


def test_help_without_flags_is_a_clear_error() -> None:
    with pytest.raises(EngineError, match="no flags found"):
        parse_help("Segmentation fault\n")


def test_argv_carries_the_plan(caps: Capabilities) -> None:
    p = plan(gemma3_270m(), [host(64 * GiB)], FitRequest(ctx=8192, slots=2, cache_type_k="q8_0",
                                                         cache_type_v="q8_0", gpu_layers=0))
    assert p.fits
    argv = build_argv(BIN, MODEL, p, caps, port=18080, threads=3, slot_save_path=Path("/tmp/slots"),
                      extra=["--jinja"])
    assert argv[0] == str(BIN) and _value_of(argv, "-m") == str(MODEL)
    assert (_value_of(argv, "--host"), _value_of(argv, "--port")) == ("127.0.0.1", "18080")
    assert _value_of(argv, "-c") == str(p.engine_ctx) == str(8192 * 2)
    assert _value_of(argv, "-np") == "2"
    assert (_value_of(argv, "--cache-type-k"), _value_of(argv, "--cache-type-v")) == ("q8_0", "q8_0")
    assert _value_of(argv, "-fa") == "on" and "--no-kv-unified" in argv and "--kv-unified" not in argv
    assert (_value_of(argv, "-ub"), _value_of(argv, "-b"), _value_of(argv, "-ngl")) == ("512", "2048", "0")
    assert (_value_of(argv, "-t"), _value_of(argv, "--slot-save-path"), _value_of(argv, "-lv")) == (
        "3", "/tmp/slots", "4")
    assert "--metrics" in argv and "--slots" in argv and argv[-1] == "--jinja"
    assert "--swa-full" not in argv and "--no-warmup" not in argv  # warmup kept: ready means it has decoded


def test_f16_cache_is_left_to_the_default_and_options_follow_the_plan(caps: Capabilities) -> None:
    p = plan(gemma3_270m(), [host(64 * GiB)], FitRequest(ctx=2048, slots=1, cache_type_k="f16", cache_type_v="f16",
                                                         kv_unified=True, flash_attn=False, swa_full=True))
    argv = build_argv(BIN, MODEL, p, caps, port=1)
    assert "--cache-type-k" not in argv and "--cache-type-v" not in argv
    assert _value_of(argv, "-fa") == "off" and "--kv-unified" in argv and "--swa-full" in argv
    assert "-t" not in argv and "--slot-save-path" not in argv


def test_optional_flags_are_skipped_when_absent(caps: Capabilities) -> None:
    p = plan(gemma3_270m(), [host(64 * GiB)], FitRequest(ctx=2048))
    bare = _without(_without(_without(caps, "--metrics"), "--slots"), "-lv")
    argv = build_argv(BIN, MODEL, p, bare, port=1)
    assert "--metrics" not in argv and "--slots" not in argv and "-lv" not in argv
    assert "-c" in argv


@pytest.mark.parametrize(("missing", "kwargs"), [("--ctx-size", {}), ("--port", {}), ("--model", {}),
                                                 ("--threads", {"threads": 2})])
def test_an_essential_absent_flag_is_incompatible(caps: Capabilities, missing: str, kwargs: dict) -> None:
    p = plan(gemma3_270m(), [host(64 * GiB)], FitRequest(ctx=2048))
    with pytest.raises(EngineIncompatible, match=missing) as e:
        build_argv(BIN, MODEL, p, _without(caps, missing), port=1, **kwargs)
    assert e.value.code == "engine_incompatible"


def test_a_cache_type_the_binary_does_not_list_is_incompatible(caps: Capabilities) -> None:
    p = plan(gemma3_270m(), [host(64 * GiB)], FitRequest(ctx=2048, cache_type_k="q4_0", cache_type_v="q4_0"))
    only_f16 = Capabilities(flags=tuple(f.model_copy(update={"choices": ("f32", "f16")})
                                        if "--cache-type-k" in f.names else f for f in caps.flags))
    with pytest.raises(EngineIncompatible, match="--cache-type-k q4_0"):
        build_argv(BIN, MODEL, p, only_f16, port=1)


def test_load_mode_uses_the_load_mode_flag_or_the_older_switches(caps: Capabilities) -> None:
    p = plan(gemma3_270m(), [host(64 * GiB)], FitRequest(ctx=2048))
    assert "--load-mode" not in build_argv(BIN, MODEL, p, caps, port=1)  # auto: the engine's own default
    assert _value_of(build_argv(BIN, MODEL, p, caps, port=1, load_mode="mlock"), "--load-mode") == "mlock"
    old = _without(caps, "--load-mode")
    with_mlock = Capabilities(flags=(*old.flags, FlagSpec(names=("--mlock",)), FlagSpec(names=("--no-mmap",))))
    assert "--mlock" in build_argv(BIN, MODEL, p, with_mlock, port=1, load_mode="mlock")
    assert "--no-mmap" in build_argv(BIN, MODEL, p, with_mlock, port=1, load_mode="none")
    with pytest.raises(EngineIncompatible, match="--mlock"):
        build_argv(BIN, MODEL, p, old, port=1, load_mode="mlock")
    with pytest.raises(EngineIncompatible, match="--load-mode"):
        build_argv(BIN, MODEL, p, old, port=1, load_mode="dio")
