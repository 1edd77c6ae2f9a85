"""llama-server as Blazar sees it: what a binary says it is (`--version`), what it accepts (`--help`), and the argv
that starts one instance of a fit plan, built only from flags the binary listed.

Parsing is pure (text in, models out) so the real outputs are test fixtures; `probe()` is the one place that runs it.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import subprocess
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from blazar.errors import EngineError, EngineIncompatible
from blazar.fit.planner import FitPlan

log = logging.getLogger("blazar.engines")

PROBE_TIMEOUT_S = 30
# The verbosity at which this engine logs its "... buffer size = N MiB" lines (info level is hidden at the
# default, 3); calibration compares those lines with the plan.
BUFFER_LOG_VERBOSITY = 4

_VERSION = re.compile(r"^version:\s*(?P<version>\S+)(?:\s*\((?P<inner>[^)]*)\))?\s*$", re.MULTILINE)
_BUILD = re.compile(r"\bbuild\s+(\d+)")
_COMMIT = re.compile(r"\bcommit\s+(\S+)")
_BUILT_WITH = re.compile(r"^built with\s+(.+?)\s*$", re.MULTILINE)

_SECTION = re.compile(r"^-{3,}")  # "----- common params -----"
_HEADER_SPLIT = re.compile(r"(?<![,\s])\s{2,}")  # the gap before the description column; "-h,    --help" is one header
_FLAG = re.compile(r"(?:^|(?<=[\s,]))(-{1,2}[A-Za-z0-9][\w.+-]*)")
_BRACKET_CHOICES = (re.compile(r"\[([\w.+-]+(?:\|[\w.+-]+)+)\]"), re.compile(r"<([\w.+-]+(?:\|[\w.+-]+)+)>"),
                    re.compile(r"\{([\w.+-]+(?:,[\w.+-]+)+)\}"))
_ALLOWED = re.compile(r"allowed values:\s*(.+)")
_BULLET = re.compile(r"^\s*-\s+([\w.+-]+):")
_ENV = re.compile(r"\(env:\s*([A-Z0-9_]+)\)")


class EngineVersion(BaseModel):
    """`llama-server --version`: "version: 0.6.0-dev (build 0, commit unknown)" and "built with GNU 12.2.0 for ..."."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str
    build: int | None = None
    commit: str | None = None
    built_with: str | None = None  # compiler and target, as printed


class FlagSpec(BaseModel):
    """One help entry: every spelling of the flag, its value placeholder, the values it lists, its env var."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    names: tuple[str, ...]
    metavar: str | None = None  # "N", "TYPE", "[on|off|auto]"; None for a switch
    choices: tuple[str, ...] = ()
    env: str | None = None
    help: str = ""


class Capabilities(BaseModel):
    """Every flag a binary's `--help` lists, with lookups by any spelling and the booleans Blazar decides on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    flags: tuple[FlagSpec, ...]

    def spec(self, *names: str) -> FlagSpec | None:
        """The entry that lists any of `names`, or None."""
        return next((f for f in self.flags if any(n in f.names for n in names)), None)

    def has(self, *names: str) -> bool:
        return self.spec(*names) is not None

    def choices(self, *names: str) -> tuple[str, ...]:
        s = self.spec(*names)
        return s.choices if s else ()

    def all_names(self) -> set[str]:
        return {n for f in self.flags for n in f.names}

    # The flags Blazar cares about, derived from the text only.
    @property
    def metrics(self) -> bool:
        return self.has("--metrics")

    @property
    def slots_endpoint(self) -> bool:
        return self.has("--slots")

    @property
    def slot_save_path(self) -> bool:
        return self.has("--slot-save-path")

    @property
    def kv_unified(self) -> bool:
        return self.has("--kv-unified", "-kvu")

    @property
    def no_kv_unified(self) -> bool:
        return self.has("--no-kv-unified", "-no-kvu")

    @property
    def flash_attn_choices(self) -> tuple[str, ...]:
        """("on", "off", "auto") for `-fa on|off|auto`; () for the old on-only switch or no flag at all."""
        return self.choices("--flash-attn", "-fa")

    @property
    def no_warmup(self) -> bool:
        return self.has("--no-warmup")

    @property
    def no_repack(self) -> bool:
        return self.has("--no-repack", "-nr")

    @property
    def mlock(self) -> bool:
        return self.has("--mlock")

    @property
    def no_mmap(self) -> bool:
        return self.has("--no-mmap")

    @property
    def cache_type_k(self) -> tuple[str, ...]:
        return self.choices("--cache-type-k", "-ctk")

    @property
    def cache_type_v(self) -> tuple[str, ...]:
        return self.choices("--cache-type-v", "-ctv")

    @property
    def parallel(self) -> bool:
        return self.has("--parallel", "-np")

    @property
    def threads(self) -> bool:
        return self.has("--threads", "-t")

    @property
    def verbosity(self) -> bool:
        return self.has("--verbosity", "--log-verbosity", "-lv")


def parse_version(text: str) -> EngineVersion:
    """The version line may follow backend-loading log lines; without one, an EngineError quotes the output."""
    m = _VERSION.search(text)
    if m is None:
        head = " | ".join(text.strip().splitlines()[:3]) or "(no output)"
        raise EngineError(f"llama-server --version: no 'version: ...' line in its output: {head}")
    inner = m.group("inner") or ""
    build, commit = _BUILD.search(inner), _COMMIT.search(inner)
    if commit is None and inner and build is None:  # the older "version: 4589 (abc1234)"
        commit = re.match(r"\s*(\S+)", inner)
    built = _BUILT_WITH.search(text)
    return EngineVersion(version=m.group("version"), build=int(build.group(1)) if build else None,
                         commit=commit.group(1) if commit else None, built_with=built.group(1) if built else None)


def _entry(header: str, desc: list[str]) -> FlagSpec:
    names = tuple(_FLAG.findall(header))
    rest = header
    for n in names:  # drop the spellings; what is left is the placeholder
        rest = rest.replace(n, "", 1)
    metavar = rest.strip(" ,") or None
    text = "\n".join(desc)
    choices: tuple[str, ...] = ()
    for rx in _BRACKET_CHOICES:
        if metavar and (c := rx.search(metavar)):
            choices = tuple(re.split(r"[|,]", c.group(1)))
            break
    if not choices and (a := _ALLOWED.search(text)):
        choices = tuple(v.strip() for v in a.group(1).split(",") if v.strip())
    if not choices and metavar:  # "- auto: ...", "- mlock: ..." bullets under a valued flag
        choices = tuple(b.group(1) for line in desc if (b := _BULLET.match(line)))
    env = _ENV.search(text)
    return FlagSpec(names=names, metavar=metavar, choices=choices, env=env.group(1) if env else None,
                    help=" ".join(line.strip() for line in desc if line.strip() and not _ENV.search(line)))


def parse_help(text: str) -> Capabilities:
    """Entries start at column 0 with a dash; the description follows after a gap, or on indented lines below."""
    entries: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("-") and not _SECTION.match(line):
            header, desc = _split_header(line)
            entries.append((header, [desc] if desc else []))
        elif entries and line[:1].isspace():
            entries[-1][1].append(line.strip())
        elif line.strip() and not _SECTION.match(line):
            entries.append(("", []))  # prose between entries ends the previous one
    flags = tuple(spec for header, desc in entries if header and (spec := _entry(header, desc)).names)
    if not flags:
        head = " | ".join(text.strip().splitlines()[:3]) or "(no output)"
        raise EngineError(f"llama-server --help: no flags found in its output: {head}")
    return Capabilities(flags=flags)


def _split_header(line: str) -> tuple[str, str]:
    parts = _HEADER_SPLIT.split(line.rstrip(), maxsplit=1)
    return parts[0], (parts[1] if len(parts) > 1 else "")


def probe(binary: Path, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[EngineVersion, Capabilities]:
    """Run `--version` and `--help` (bounded, output merged: some builds log backend loading to stderr first)."""
    outs = []
    for arg in ("--version", "--help"):
        try:
            proc = subprocess.run([str(binary), arg], capture_output=True, text=True, timeout=timeout_s, check=False,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise EngineError(f"{binary} {arg}: {e}") from e
        outs.append(proc.stdout + proc.stderr)
    return parse_version(outs[0]), parse_help(outs[1])


def _flag(caps: Capabilities, *names: str, need: str | None = None) -> str | None:
    """The first of `names` (the spelling we prefer) when the binary lists the flag under any of them, else
    the binary's own spelling; None when it is absent, or EngineIncompatible when `need` says why it is needed."""
    spec = caps.spec(*names)
    if spec is None:
        if need is None:
            return None
        raise EngineIncompatible(names[-1], need)
    return next((n for n in names if n in spec.names), spec.names[0])


def _value(caps: Capabilities, flag: str, value: str, why: str) -> str:
    """`value` when the flag lists no choices or lists it; a listed set without it is an incompatibility."""
    choices = caps.choices(flag)
    if choices and value not in choices:
        raise EngineIncompatible(f"{flag} {value}", f"{why} (it accepts {', '.join(choices)})")
    return value


def engine_key(caps: Capabilities, keyfile: Path) -> tuple[str | None, list[str]]:
    """A fresh secret for one child, and the flags that give it: `--api-key-file` (the secret in `keyfile`, 0600),
    else `--api-key` (visible in /proc to this user: logged), else none (an old build: its port stays open)."""
    if not caps.has("--api-key-file") and not caps.has("--api-key"):
        log.warning("this llama-server has no --api-key: its port is open to every local user")
        return None, []
    secret = "eng_" + secrets.token_urlsafe(32)
    if caps.has("--api-key-file"):
        keyfile.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secret + "\n")
        return secret, ["--api-key-file", str(keyfile)]
    log.warning("this llama-server has no --api-key-file: its key is passed as --api-key, which other processes of "
                "this user can read in /proc")
    return secret, ["--api-key", secret]


def redact_argv(argv: Sequence[str]) -> list[str]:
    """argv as the log may record it: an `--api-key` value replaced."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--api-key":
            out[i + 1] = "<redacted>"
    return out


def build_argv(binary: Path, model: Path, plan: FitPlan, caps: Capabilities, *, port: int, host: str = "127.0.0.1",
               threads: int | None = None, slot_save_path: Path | None = None, load_mode: str = "auto",
               projector: Path | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The argv of one instance of `plan`, from flags `caps` lists. What the plan's memory depends on, and what
    the caller asked for, is required (EngineIncompatible names the flag); observability flags are skipped when
    absent. Warmup stays on: its empty decode makes /health's "ok" mean the engine has decoded once."""
    if not plan.fits:
        raise EngineError(f"the plan for {plan.model or 'this model'} does not fit: {plan.summary}")
    argv = [str(binary)]
    add = _FlagAdder(caps, argv)
    add(("-m", "--model"), str(model), need="the model file")
    if projector is not None:
        add(("-mm", "--mmproj"), str(projector), need="the model's projector (images or audio)")
        if not plan.projector_offload:
            add(("--no-mmproj-offload",), need="the projector planned on the host (VRAM is tight)")
    add(("--host",), host, need="loopback binding")
    add(("--port",), str(port), need="the port Blazar routes to")
    add(("-c", "--ctx-size"), str(plan.engine_ctx), need=f"the planned context ({plan.engine_ctx} tokens)")
    add(("-np", "--parallel"), str(plan.slots), need=f"the planned slots ({plan.slots})")
    _add_kv_cache_flags(add, plan)
    add(("-ub", "--ubatch-size"), str(plan.n_ubatch), need="the planned micro-batch (compute buffer size)")
    add(("-b", "--batch-size"), str(plan.n_batch), need="the planned batch")
    if plan.gpu_layers or caps.has("-ngl", "--gpu-layers", "--n-gpu-layers"):  # -ngl 0 must be said: default is auto
        add(("-ngl", "--gpu-layers", "--n-gpu-layers"), str(plan.gpu_layers), need="the planned offload")
    _add_rpc_flags(add, plan)
    if plan.swa_full:
        add(("--swa-full",), need="the planned full-size SWA cache")
    if threads is not None:
        add(("-t", "--threads"), str(threads), need=f"{threads} threads were asked for")
    if load_mode != "auto":
        _add_load_mode(caps, load_mode, argv)
    if slot_save_path is not None:
        add(("--slot-save-path",), str(slot_save_path), need="a slot save path was given")
    # NOTE: llama-server's host-memory prompt cache (8 GiB by default) is memory the fit does not plan for, and it
    # hands any slot the best-matching prefix of anyone's earlier prompt: with keys on, one tenant's prompt to
    # another. Sessions keep their prefix in their slot and the KV bank instead.
    add(("--cache-ram", "-cram"), "0")
    add(("--metrics",))
    add(("--slots",))
    # The "... buffer size = N MiB" lines are info level, which this engine hides below verbosity 4; calibration
    # compares them with the plan, so ask for them whenever the flag exists.
    add(("-lv", "--verbosity", "--log-verbosity"), str(BUFFER_LOG_VERBOSITY))
    argv.extend(extra)
    return argv


class _FlagAdder:
    """Appends a flag `caps` lists, by whichever of its names the binary knows, to `argv`. With `need` (why the
    plan or the caller depends on it) a missing flag or refused value raises EngineIncompatible; without, the flag
    is skipped."""

    def __init__(self, caps: Capabilities, argv: list[str]) -> None:
        self.caps = caps
        self.argv = argv

    def __call__(self, names: tuple[str, ...], value: str | None = None, need: str | None = None) -> None:
        flag = _flag(self.caps, *names, need=need)
        if flag is None:
            return
        if value is not None:
            try:
                value = _value(self.caps, flag, value, need or "")
            except EngineIncompatible:
                if need is not None:
                    raise
                return  # an optional flag that does not take this value is skipped like an absent one
        self.argv.extend([flag] if value is None else [flag, value])


def _add_rpc_flags(add: _FlagAdder, plan: FitPlan) -> None:
    """A plan that puts layers on RPC workers: --rpc names them, and --tensor-split gives every offload device its
    planned count of the offloaded layers, output layer included, in llama.cpp's order (the workers as --rpc names
    them, then local GPUs): llama.cpp would otherwise split by the free memory each rpc-server reports of its whole
    host rather than what its worker offers. Workers the plan gives nothing are left out of both."""
    offload = [u for u in plan.devices if u.kind == "cuda" or (u.kind == "rpc" and u.offloaded)]
    workers = [u.name for u in offload if u.kind == "rpc"]
    if not workers:
        return
    add(("--rpc",), ",".join(workers), need=f"the plan puts layers on RPC workers ({', '.join(workers)})")
    add(("-ts", "--tensor-split"), ",".join(str(u.offloaded) for u in offload),
        need="the planned split across devices")


def _add_kv_cache_flags(add: _FlagAdder, plan: FitPlan) -> None:
    """The flags the plan's KV cache size depends on: cache types, flash attention, unified or per-slot buffers."""
    caps = add.caps
    for names, kind in ((("--cache-type-k", "-ctk"), plan.cache_type_k),
                        (("--cache-type-v", "-ctv"), plan.cache_type_v)):
        if kind != "f16":  # the engine's default; omitting it keeps the argv short and old builds working
            add(names, kind, need=f"the planned {kind} KV cache")
    fa = caps.spec("-fa", "--flash-attn")
    if fa is not None and fa.metavar:  # "-fa on|off|auto": say what the plan assumed, either way
        add(("-fa", "--flash-attn"), "on" if plan.flash_attn else "off", need="the planned attention kernel")
    elif plan.flash_attn:  # an older on-only switch, or none: required only when the plan counts on it
        add(("-fa", "--flash-attn"), need="the plan assumes flash attention")
    if plan.kv_unified:
        add(("--kv-unified", "-kvu"), need="the planned unified KV buffer")
    elif caps.kv_unified or caps.no_kv_unified:  # with neither, the build predates the unified buffer
        add(("--no-kv-unified", "-no-kvu"), need="per-slot KV buffers as planned")


# Older builds spell the loading modes as switches: what each mode means in their terms (None: their default).
_LEGACY_LOAD_MODE: dict[str, tuple[str, ...] | None] = {
    "mmap": (), "mlock": ("--mlock",), "mmap+mlock": ("--mlock",), "none": ("--no-mmap",),
}


def _add_load_mode(caps: Capabilities, mode: str, argv: list[str]) -> None:
    """`--load-mode MODE` where the binary has it, else the older `--mlock` / `--no-mmap` switches."""
    if caps.has("--load-mode", "-lm"):
        flag = _flag(caps, "--load-mode", "-lm", need=f"load_mode {mode}")
        assert flag is not None
        argv.extend([flag, _value(caps, flag, mode, f"load_mode {mode} was asked for")])
        return
    legacy = _LEGACY_LOAD_MODE.get(mode)
    if legacy is None:
        raise EngineIncompatible("--load-mode", f"load_mode {mode} was asked for and this build has no such flag")
    for switch in legacy:
        argv.append(_flag(caps, switch, need=f"load_mode {mode} was asked for") or switch)
