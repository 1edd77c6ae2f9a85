"""The `blazar` command: every sub-command, and one place that turns a BlazarError, or a write that found no space
left (whatever raised it), into a one-line message and an exit code."""

from __future__ import annotations

import sys

import typer
from rich.text import Text

from blazar import __version__
from blazar.bootstrap import paths_from_env
from blazar.cli import (
    archive_cmds,
    audio_cmds,
    audit_cmds,
    bench_cmds,
    config_cmds,
    db,
    doctor_cmds,
    engine_cmds,
    fit_cmds,
    instance_cmds,
    keys_cmds,
    launch_cmds,
    log_cmds,
    lora_cmds,
    model_cmds,
    model_settings_cmds,
    node_cmds,
    remote_cmds,
    run_cmds,
    session_cmds,
    snapshot_cmds,
    tune_cmds,
    watch_cmds,
    why_cmds,
    worker_cmds,
)
from blazar.cli.common import err
from blazar.diskspace import explain
from blazar.errors import BlazarError, DiskFull

app = typer.Typer(
    name="blazar",
    help="Blazar: the control plane for local AI inference. Every change is an event in one append-only log.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"blazar {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Paths: config in $XDG_CONFIG_HOME/blazar, data in $XDG_DATA_HOME/blazar; BLAZAR_HOME overrides both."""


app.command("pull")(model_cmds.pull)
app.command("import")(model_cmds.import_)
app.command("list")(model_cmds.list_)
app.command("show")(model_cmds.show)
app.command("rm")(model_cmds.rm)
app.command("alias")(model_cmds.alias)
app.command("serve")(instance_cmds.serve)
app.command("load")(instance_cmds.load)
app.command("stop")(instance_cmds.stop)
app.command("ps")(instance_cmds.ps)
app.command("run")(run_cmds.run)
app.command("transcribe")(audio_cmds.transcribe)
app.command("speak")(audio_cmds.speak)
app.command("fit")(fit_cmds.fit)
app.command("bench")(bench_cmds.bench)
app.command("coreside")(fit_cmds.coreside)
app.command("events")(log_cmds.events)
app.command("state")(log_cmds.state)
app.command("snapshot")(snapshot_cmds.snapshot)
app.command("restore")(snapshot_cmds.restore)
app.command("why")(why_cmds.why)
app.command("tune")(tune_cmds.tune_command)
app.command("watch")(watch_cmds.watch)
app.command("doctor")(doctor_cmds.doctor)
app.command("launch", context_settings={"allow_interspersed_args": False})(launch_cmds.launch)
app.add_typer(db.app, name="db")
app.add_typer(config_cmds.app, name="config")
app.add_typer(audit_cmds.app, name="audit")
app.add_typer(archive_cmds.app, name="log")
app.add_typer(engine_cmds.app, name="engine")
app.add_typer(keys_cmds.app, name="keys")
app.add_typer(model_settings_cmds.app, name="model")
app.add_typer(lora_cmds.app, name="lora")
app.add_typer(session_cmds.app, name="session")
app.add_typer(remote_cmds.app, name="remote")
app.add_typer(worker_cmds.app, name="worker")
app.add_typer(node_cmds.app, name="node")


def _disk_full(exc: BaseException) -> DiskFull | None:
    """`exc` as the full disk that caused it, if one did: whatever part of Blazar met it (the log, config.toml, a
    snapshot, a model file), the command ends with one line naming the disk."""
    try:
        home = paths_from_env().data_dir
    except Exception:  # the message falls back to the exception's own
        return None
    return explain(exc, home, writing=f"Blazar's files under {home}")


def main() -> None:
    try:
        app()
    except Exception as exc:
        shown = _disk_full(exc) or exc
        if not isinstance(shown, BlazarError):
            raise
        # NOTE: the message as a Text, never markup: it carries names and paths ("x:smile:" is not an emoji,
        # "[red]" in a path is not a style).
        err.print(Text.assemble(("error:", "bold red"), " ", shown.message), soft_wrap=True)
        sys.exit(shown.exit_code)


if __name__ == "__main__":
    main()
