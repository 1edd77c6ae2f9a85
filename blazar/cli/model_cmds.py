"""Model store commands: `blazar import`, `pull`, `list`, `show`, `rm`, `alias`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from blazar.adapters.engines.kinds import ROUTE_PATHS, engine_kind
from blazar.cli import provision
from blazar.cli.common import JSON_OPTION, err, fmt_ts, opened, out, print_json, run
from blazar.cli.daemon_client import tell_daemon
from blazar.cli.instance_cmds import load_in_daemon, say_ready
from blazar.cli.model_settings_cmds import describe
from blazar.cluster.nodes import pull_on_node
from blazar.events.models import ModelImported
from blazar.events.projectors import ModelProjectorSet
from blazar.fit import FitPlan, FitRequest
from blazar.fit.posture import with_posture
from blazar.instances.planning import fit_model
from blazar.queries.catalog import StoredModel, TemplateProbe, aliases, models
from blazar.queries.catalog import model as stored_model
from blazar.queries.profiles import ProfileStatus, profile_status
from blazar.store.chat_templates import capabilities, served_template
from blazar.store.model_settings import reranks
from blazar.store.models import alias_model, import_model, remove_model, unalias_model
from blazar.store.projectors import import_with_projector
from blazar.store.pull import pull as pull_model
from blazar.store.pull_target import parse_target

# Messages that carry a model name: "x:smile" followed by ": ..." must not print as an emoji.
_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}


def _human(n: int | float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def import_(
    file: Annotated[Path | None, typer.Argument(
        help="A GGUF file, a CTranslate2 whisper model directory, or a piper VOICE.onnx (its .onnx.json beside it). "
        "With --from: the other tool's store directory (default: where that tool keeps it).",
        show_default=False)] = None,
    name: Annotated[str | None, typer.Option(
        "--name", "-n", help="The name to serve it under, e.g. mymodel:q4 (required for a FILE).")] = None,
    mmproj: Annotated[Path | None, typer.Option(
        "--mmproj", help="Its multimodal projector (a vision or audio mmproj-*.gguf): loaded beside it with "
        "--mmproj, so it takes images (or audio).")] = None,
    load: Annotated[bool, typer.Option(
        "--load", help="Then load it and wait until it serves, as `blazar load` does (starting the daemon when none "
        "runs).")] = False,
    from_: Annotated[str | None, typer.Option(
        "--from", help="Import every model of another tool's store: ollama, lmstudio, hf-cache or llama-cpp "
        "(hardlinked, else reflinked, else copied; a second run imports nothing new).",
        show_default=False)] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="With --from: show what was found and what would be done; write nothing.")] = False,
    only: Annotated[list[str] | None, typer.Option(
        "--only", help="With --from: just the model of this name (as the table shows it); repeat it, or give "
        "several separated by commas.", show_default=False)] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """Validate a model and add it to the store (hardlinked, else reflinked, else copied): a GGUF (served by
    llama-server), a whisper model directory (speech to text) or a piper voice (text to speech), told by its files.
    Or, with --from TOOL, every model another tool (Ollama, LM Studio, the Hugging Face cache, llama.cpp) keeps."""
    if from_ is not None:
        if name is not None or mmproj is not None or load:
            raise typer.BadParameter("--from imports every model under the names the table shows; --name, --mmproj "
                                     "and --load are for one FILE", param_hint="--from")
        from blazar.cli.import_cmds import import_from  # the readers and the table: only --from needs them

        import_from(from_, file, dry_run=dry_run, only=[n for o in only or () for n in o.split(",") if n.strip()],
                    as_json=as_json)
        return
    if dry_run or only:
        raise typer.BadParameter("--dry-run and --only go with --from TOOL", param_hint="--dry-run/--only")
    if file is None or name is None:
        raise typer.BadParameter("give a FILE and --name NAME (or --from TOOL to import another tool's models)",
                                 param_hint="FILE/--name")
    _import_file(file, name, mmproj, load, as_json)


def _import_file(file: Path, name: str, mmproj: Path | None, load: bool, as_json: bool) -> None:
    src, proj_src = file.absolute(), mmproj.absolute() if mmproj is not None else None

    async def go() -> Any:
        async with opened() as app:
            if proj_src is None:
                return await import_model(app, src, name), None, app.paths
            return *await import_with_projector(app, src, name, proj_src), app.paths

    rec, proj, paths = run(go())
    tell_daemon(paths)  # a running daemon serves it from the very next request
    if not as_json:
        _imported(rec.event, proj.event if proj is not None else None)
    inst = load_in_daemon(rec.event.name) if load else None  # said before the load, which may take a while
    if as_json:
        print_json({**rec.to_json(), "projector": proj.to_json() if proj is not None else None,
                    **({"instance": inst} if inst is not None else {})})
    elif inst is not None:
        say_ready(inst)


def _imported(ev: ModelImported, proj: ModelProjectorSet | None) -> None:
    how = placed_words(ev)
    if ev.kind != "llama-server":
        out.print(f"imported {ev.name}: a {ev.kind} model ({engine_kind(ev.kind).describes}), {len(ev.shards)} "
                  f"files, {_human(ev.bytes)}, {how}; sha256 {ev.sha256[:16]}…", **_VERBATIM)
        return
    out.print(f"imported {ev.name}: {ev.metadata.architecture}, {ev.metadata.file_type or '?'}, "
              f"{_human(ev.bytes)}, {how}; sha256 {ev.sha256[:16]}…", **_VERBATIM)
    if proj is not None:
        out.print(projector_line(proj), **_VERBATIM)


def placed_words(ev: ModelImported) -> str:
    """How the import placed the file, in words (events before reflinks say only linked or not)."""
    if ev.linked:
        return "linked"
    if ev.placed == "reflink":
        return "reflinked (a copy-on-write clone: no byte copied)"
    return "copied (a hardlink was not possible across these filesystems)"


def projector_line(ev: ModelProjectorSet) -> str:
    """One line saying which projector a model got and what it lets it take in."""
    meta = ev.metadata
    return (f"projector for {ev.name}: {meta.projector_type or '?'} ({', '.join(meta.modalities)}), "
            f"{_human(ev.bytes)} from {ev.source}; sha256 {ev.sha256[:16]}…")


def _pull_on_node(target: str, node: str, name: str | None, as_json: bool) -> None:
    if name is not None:
        raise typer.BadParameter("another node stores the model under its own default name", param_hint="--name")
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True, disable=as_json) as bar:
        task = bar.add_task(f"{target} on {node}", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        async def go() -> str:
            async with opened() as app:
                return await pull_on_node(app, node, target, progress)

        run(go())
    if as_json:
        print_json({"node": node, "target": target, "status": "success"})
    else:
        out.print(f"node {node} pulled {target} into its store", **_VERBATIM)


def _install_what_pull_needs(target: str, name: str | None) -> None:
    """A registry model's package, installed into this environment first when it is missing (cli/provision.py),
    unless the model is in the store already."""
    needed = provision.pull_requirements(target)
    if not needed:
        return

    async def present() -> bool:
        async with opened() as app:
            return stored_model(app, name or parse_target(target).default_name()) is not None

    if not run(present()):
        provision.pull_packages(target, needed, lambda line: err.print(line, style="dim", **_VERBATIM))


def pull(
    target: Annotated[str, typer.Argument(help="gemma3-270m | owner/repo[:QUANT] | owner/repo/file.gguf")],
    name: Annotated[str | None, typer.Option("--name", "-n", help="Store it under this name.")] = None,
    node: Annotated[str | None, typer.Option(
        "--node", help="Into that node's store instead (gateways sharing a PostgreSQL log; needs "
        "BLAZAR_CLUSTER_KEY): it downloads, this command follows its progress.")] = None,
    no_mmproj: Annotated[bool, typer.Option(
        "--no-mmproj", help="Leave out the projector (mmproj-*.gguf) a hub repo has beside the model: text only.")
    ] = False,
    load: Annotated[bool, typer.Option(
        "--load", help="Then load it and wait until it serves, as `blazar load` does (starting the daemon when none "
        "runs).")] = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Download a model (resumable, verified by sha256) from the registry or a Hugging Face hub (HF_ENDPOINT). From a
    hub repo with a projector beside the model (mmproj-*.gguf: the one in the model's precision, else F16, else the
    first), that comes too, so the model takes images."""
    if node is not None:
        if load:
            raise typer.BadParameter("a pull into another node's store is loaded there: `blazar load` on that node",
                                     param_hint="--load")
        _pull_on_node(target, node, name, as_json)
        return
    _install_what_pull_needs(target, name)
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True, disable=as_json) as bar:
        task = bar.add_task(target, total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        async def go() -> Any:
            async with opened() as app:
                return await pull_model(app, target, name=name, progress=progress, mmproj=not no_mmproj)

        try:
            result = run(go())
        except KeyboardInterrupt:
            err.print("cancelled: the partial download is kept; run the same pull again to resume")
            raise typer.Exit(130) from None
    if as_json:
        inst = load_in_daemon(result.name) if load else None
        print_json({**result.to_json(), **({"instance": inst} if inst is not None else {})})
        return
    if result.already_present:
        out.print(f"{result.name} is already in the store ({_human(result.bytes)})", **_VERBATIM)
    else:
        out.print(f"pulled {result.name}: {_human(result.bytes)}, sha256 {result.sha256[:16]}… verified", **_VERBATIM)
        if result.projector is not None:
            out.print(f"with its projector {result.projector} (blazar show {result.name} says what it takes in; "
                      "pull with --no-mmproj to leave it out)", **_VERBATIM)
    if load:
        say_ready(load_in_daemon(result.name))


def list_(as_json: bool = JSON_OPTION) -> None:
    """List the models in the store."""

    async def go() -> list[StoredModel]:
        async with opened() as app:
            return models(app)

    rows = run(go())
    if as_json:
        print_json([m.to_json() for m in rows])
        return
    if not rows:
        out.print("no models yet: blazar pull gemma3-270m, or blazar import FILE --name NAME")
        return
    table = Table("name", "kind", "arch", "params", "quant", "ctx", "size", "added", box=None, header_style="bold")
    for m in rows:
        md = m.metadata
        shown = m.name + (f" (variant of {m.base})" if m.base else "")
        if not m.gguf:  # a whisper model or a piper voice: no GGUF facts to show
            table.add_row(shown, m.kind, md.architecture, "-", "-", "-", _human(m.bytes), fmt_ts(m.added_ts))
            continue
        table.add_row(shown, m.kind, md.architecture, _params(md.parameter_count), md.file_type or "-",
                      str(md.ctx_train or "-"), _human(m.bytes), fmt_ts(m.added_ts))
    out.print(table)


def show(
    model: Annotated[str, typer.Argument(help="A model name from `blazar list`.")],
    as_json: bool = JSON_OPTION,
) -> None:
    """Everything known about one model: metadata, capabilities, file, sha256, where it came from."""
    from blazar.errors import ModelNotFound

    async def go() -> tuple[StoredModel, Path, FitPlan, ProfileStatus]:
        async with opened() as app:
            entry = stored_model(app, model)
            if entry is None:
                raise ModelNotFound(f"no model named {model!r} in the store (see: blazar list)")
            tuned = profile_status(app, entry.name)  # an applied profile shapes the fit a load would make
            posture = tuned.profile.posture if tuned.status == "applied" and tuned.profile is not None else None
            return (entry, app.paths.models / entry.file,
                    await fit_model(app, entry.name, with_posture(FitRequest(), posture)), tuned)

    entry, file, plan, tuned = run(go())
    if not entry.gguf:
        _show_other_kind(entry, file, plan, as_json)
        return
    md = entry.metadata
    probe = entry.template_probe
    served = served_template(md, entry.settings, probe.chosen if probe is not None else None)
    modalities = entry.projector.modalities if entry.projector is not None else ()
    caps = capabilities(md, modalities) + (["rerank"] if reranks(md, entry.settings) else [])
    template = {"source": served.source, "name": served.name, "summary": served.describe(),
                "stops": list(served.stops), "sampling": dict(served.sampling),
                "probe": probe.to_json() if probe is not None else None}
    if as_json:
        print_json({**entry.to_json(), "file": str(file),
                    "settings": entry.settings.model_dump(mode="json") if entry.settings is not None else None,
                    "fit": {"fits": plan.fits, "summary": plan.summary, "ctx_per_slot": plan.ctx_per_slot,
                            "slots": plan.slots, "cache_type_k": plan.cache_type_k,
                            "cache_type_v": plan.cache_type_v, "total_bytes": plan.total_bytes,
                            "projector_bytes": plan.projector_bytes, "projector_device": plan.projector_device},
                    "capabilities": caps, "template": template, "profile": tuned.to_json()})
        return
    table = Table(show_header=False, box=None)
    rows = [
        ("name", entry.name), ("file", str(file)), ("size", _human(entry.bytes)), ("sha256", entry.sha256),
        ("source", f"{entry.source} ({entry.source_kind})"), ("added", fmt_ts(entry.added_ts)),
        ("architecture", md.architecture), ("parameters", _params(md.parameter_count)),
        ("quantization", md.file_type or "-"), ("context (trained)", str(md.ctx_train or "-")),
        ("layers", str(md.block_count)),
        ("heads / kv heads", f"{md.head_count or '-'} / {md.head_count_kv or '-'}"),
        ("key / value length", f"{md.key_length or '-'} / {md.value_length or '-'}"),
        ("sliding window", str(md.sliding_window or "-")),
        ("experts", f"{md.expert_count} ({md.expert_used_count} used)" if md.expert_count else "-"),
        ("capabilities", ", ".join(caps)),
        ("projector", _projector_row(entry)),
        ("adapters", _lora_row(entry)),
        ("fit here", plan.summary),
        ("posture", tuned.summary()),
        *([("variant of", entry.base)] if entry.base else []),
        *[(k, served.describe() if k == "template" else v) for k, v in describe(entry.settings)],
        *([("template probe", _probe_row(probe))] if probe is not None else []),
    ]
    for k, v in rows:
        table.add_row(f"[bold]{k}[/bold]", v)
    out.print(table)


def _probe_row(probe: TemplateProbe) -> str:
    """Each template's numbers in its model's template probe (blazar/instances/template_probe.py)."""
    trials = "; ".join(f"{t.template}: {t.answered} of {probe.prompts} answered, {t.ended} ended, {t.tokens} tokens"
                       for t in probe.trials)
    return f"chose {probe.chosen} ({trials}; at most {probe.max_tokens} tokens each, on {probe.engine_tag})"


def _lora_row(entry: StoredModel) -> str:
    """Its LoRA adapters in load order (a request's {"id": i} is the i-th)."""
    if not entry.loras:
        return "- (blazar lora add NAME FILE --name ADAPTER adds one)"
    return "; ".join(f"{i}: {a.name} (rank {a.metadata.rank or '?'}, {_human(a.bytes)}, sha256 {a.sha256[:16]}…)"
                     for i, a in enumerate(entry.loras))


def _projector_row(entry: StoredModel) -> str:
    proj = entry.projector
    if proj is None:
        return "- (text only; blazar model set NAME --mmproj FILE adds one)"
    meta = proj.metadata
    return (f"{meta.projector_type or '?'} ({', '.join(proj.modalities)}), {_human(proj.bytes)}, "
            f"sha256 {proj.sha256[:16]}…, from {proj.source}")
def _show_other_kind(entry: StoredModel, file: Path, plan: FitPlan, as_json: bool) -> None:
    """`blazar show` of a whisper model or a piper voice: its kind, what it serves and its files (no GGUF facts)."""
    kind = engine_kind(entry.kind)
    serves = [ROUTE_PATHS[r] for r in ROUTE_PATHS if kind.serves(r)]
    if as_json:
        print_json({**entry.to_json(), "file": str(file), "serves": serves, "describes": kind.describes,
                    "fit": {"fits": plan.fits, "summary": plan.summary, "total_bytes": plan.total_bytes},
                    "capabilities": sorted(kind.routes)})
        return
    table = Table(show_header=False, box=None)
    rows = [
        ("name", entry.name), ("kind", f"{kind.name} ({kind.describes})"), ("serves", ", ".join(serves)),
        ("files", ", ".join(Path(f).name for f in entry.files)), ("directory", str(file.parent)),
        ("size", _human(entry.bytes)), ("sha256", f"{entry.sha256} (over its files' sha256 lines)"),
        ("source", f"{entry.source} ({entry.source_kind})"), ("added", fmt_ts(entry.added_ts)),
        ("fit here", plan.summary),
    ]
    for k, v in rows:
        table.add_row(f"[bold]{k}[/bold]", v)
    out.print(table)


def rm(model: Annotated[str, typer.Argument(help="A model name from `blazar list`.")]) -> None:
    """Remove a model from the store (its file is deleted when no other link to it remains)."""

    async def go() -> Any:
        async with opened() as app:
            return await remove_model(app, model), app.paths

    rec, paths = run(go())
    tell_daemon(paths)  # a running daemon stops listing it at once
    if rec.type == "model.alias_removed":
        out.print(f"removed alias {rec.event.alias} (its model {rec.event.target} stays)", **_VERBATIM)
        return
    freed = "file deleted" if rec.event.file_deleted else "file kept (still linked elsewhere)"
    out.print(f"removed {rec.event.name}: {freed}", **_VERBATIM)



def alias(
    name: Annotated[str | None, typer.Argument(help="The alias (a model name: [a-z0-9._-], optional :tag).")] = None,
    model: Annotated[str | None, typer.Argument(help="The model it names.")] = None,
    remove: Annotated[bool, typer.Option("--remove", help="Remove the alias NAME.")] = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Give a model another name (for clients that ask for a fixed one), remove one, or list them."""

    async def go() -> Any:
        async with opened() as app:
            if name is None:
                return aliases(app)
            if remove:
                return await unalias_model(app, name)
            if model is None:
                raise typer.BadParameter("give the model the alias names (or --remove)")
            return await alias_model(app, name, model)

    res = run(go())
    if isinstance(res, dict):
        if as_json:
            print_json(res)
        elif not res:
            out.print("no aliases")
        else:
            for a, t in sorted(res.items()):
                out.print(f"{a} -> {t}", **_VERBATIM)
        return
    ev = res.event
    if as_json:
        print_json(ev.model_dump(mode="json"))
    elif remove:
        out.print(f"removed alias {ev.alias} (of {ev.target})", **_VERBATIM)
    else:
        out.print(f"{ev.alias} -> {ev.target}", **_VERBATIM)
