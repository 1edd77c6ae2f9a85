"""The `blazar` command: every sub-command, and one place that turns a BlazarError, or a write that found no space
left (whatever raised it), into a one-line message and an exit code."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer
import typer.main
from rich.text import Text

from blazar import __version__
from blazar.cli.common import err
from blazar.errors import BlazarError, DiskFull

# Every sub-command, as where it lives ("module:attribute" under blazar.cli): a function is a command, a Typer is a
# group. NOTE: only the module of the command being run is imported. Importing them all (the daemon, the gateway,
# GGUF inspection, FFmpeg's bindings...) cost every command about two seconds of CPU before it did anything.
COMMANDS: dict[str, str] = {
    "pull": "model_cmds:pull",
    "import": "model_cmds:import_",
    "list": "model_cmds:list_",
    "show": "model_cmds:show",
    "rm": "model_cmds:rm",
    "alias": "model_cmds:alias",
    "serve": "instance_cmds:serve",
    "load": "instance_cmds:load",
    "stop": "instance_cmds:stop",
    "ps": "instance_cmds:ps",
    "run": "run_cmds:run",
    "transcribe": "audio_cmds:transcribe",
    "speak": "audio_cmds:speak",
    "fit": "fit_cmds:fit",
    "bench": "bench_cmds:bench",
    "coreside": "fit_cmds:coreside",
    "search": "search_cmds:search",
    "drafts": "search_cmds:drafts",
    "events": "events_cmds:events",
    "state": "events_cmds:state",
    "snapshot": "snapshot_cmds:snapshot",
    "restore": "snapshot_cmds:restore",
    "why": "why_cmds:why",
    "tune": "tune_cmds:tune_command",
    "watch": "watch_cmds:watch",
    "doctor": "doctor_cmds:doctor",
    "launch": "launch_cmds:launch",
    "db": "db:app",
    "config": "config_cmds:app",
    "audit": "audit_cmds:app",
    "log": "log_cmds:app",
    "engine": "engine_cmds:app",
    "keys": "keys_cmds:app",
    "model": "model_settings_cmds:app",
    "lora": "lora_cmds:app",
    "session": "session_cmds:app",
    "remote": "remote_cmds:app",
    "realtime": "realtime_cmds:app",
    "worker": "worker_cmds:app",
    "node": "node_cmds:app",
    "service": "service_cmds:app",
}
# `blazar launch -- CMD ARGS`: everything after the command's own options is the program's.
_CONTEXT_SETTINGS: dict[str, dict[str, Any]] = {"launch": {"allow_interspersed_args": False}}


def load_command(name: str) -> Any:
    """The function or Typer that `name` runs (importing its module)."""
    module, attribute = COMMANDS[name].split(":")
    return getattr(importlib.import_module(f"blazar.cli.{module}"), attribute)


class _LazyGroup(typer.main.TyperGroup):
    """The root group: a sub-command's module is imported when it is asked for (to run it, or to list it in
    `blazar --help`), and turned into its click command the way Typer would have done at start."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            holder = typer.Typer()
            target = load_command(cmd_name)
            if isinstance(target, typer.Typer):
                holder.add_typer(target, name=cmd_name)
            else:
                holder.command(cmd_name, context_settings=_CONTEXT_SETTINGS.get(cmd_name))(target)
            self.commands[cmd_name] = typer.main.get_group(holder).commands[cmd_name]
        return self.commands.get(cmd_name)


app = typer.Typer(
    name="blazar",
    cls=_LazyGroup,
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


def _disk_full(exc: BaseException) -> DiskFull | None:
    """`exc` as the full disk that caused it, if one did: whatever part of Blazar met it (the log, config.toml, a
    snapshot, a model file), the command ends with one line naming the disk."""
    from blazar.bootstrap import paths_from_env
    from blazar.diskspace import explain

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
