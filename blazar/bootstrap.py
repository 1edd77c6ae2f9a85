"""The composition root: the one place that reads the environment and wires paths, log, projections and
handlers together. The CLI and the daemon both start here."""

from __future__ import annotations

import getpass
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from blazar import config as settings
from blazar.clock import Clock, SystemClock
from blazar.events.log import EventLog
from blazar.events.writer import GroupCommitWriter
from blazar.paths import Paths
from blazar.projections import all_projections
from blazar.projections.runner import ProjectionRunner
from blazar.queries.file_modes import loose_modes

if TYPE_CHECKING:
    from blazar.adapters.hub import Hub

PRIVATE_UMASK = 0o077
# A CLI command that had to fold more than this many events at start leaves a checkpoint behind on close.
CHECKPOINT_ON_CLOSE_AFTER = 1_000


@dataclass
class Blazar:
    """Everything a command needs: where files are, the log, live projections, who is acting."""

    paths: Paths
    log: EventLog
    runner: ProjectionRunner
    clock: Clock
    actor: str
    folded_at_start: int = 0
    writer: GroupCommitWriter | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    _hub: Hub | None = None

    def request_writer(self) -> GroupCommitWriter:
        """The group-commit writer for request events, started on first use with `group_commit_ms` from config;
        `close()` drains it."""
        if self.writer is None:
            self.writer = GroupCommitWriter(self.log, interval=self.settings().group_commit_ms / 1000)
            self.writer.start()
        return self.writer

    def hub(self) -> Hub:
        """The Hugging Face hub client, configured from HF_ENDPOINT and HF_TOKEN as they were at start."""
        if self._hub is None:
            from blazar.adapters.hub import hub_from_env  # huggingface_hub costs 0.2 s to import: only when used

            self._hub = hub_from_env(self.env)
        return self._hub

    def overrides(self) -> dict[str, object]:
        return dict(self.runner.state("config")["overrides"])

    def settings(self) -> settings.Settings:
        known = {k: v for k, v in self.overrides().items() if k in settings.FIELDS}
        return settings.Settings(**known)

    async def close(self) -> None:
        if self.writer is not None:
            await self.writer.stop()
        await self.runner.stop(checkpoint=self.folded_at_start >= CHECKPOINT_ON_CLOSE_AFTER)
        await self.log.close()


def paths_from_env(env: Mapping[str, str] | None = None) -> Paths:
    return Paths.from_env(env)


def default_actor(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    try:
        user = env.get("USER") or getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"cli:{user}"


async def bootstrap(
    *,
    paths: Paths | None = None,
    env: Mapping[str, str] | None = None,
    actor: str | None = None,
    clock: Clock | None = None,
    reconcile_config: bool = True,
) -> Blazar:
    """Open the log (migrating it), catch projections up, and notice hand edits of config.toml."""
    from blazar.handlers.config import reconcile_file  # handlers import bootstrap's types

    # NOTE: every file and directory this process creates is the owner's alone (db, WAL, config, run/, log/,
    # snapshots, exports, engine builds): one umask rather than a mode at each of the places that write.
    os.umask(PRIVATE_UMASK)
    paths = paths or paths_from_env(env)
    paths.ensure()
    clock = clock or SystemClock()
    log = await EventLog.open(paths.db, clock=clock)
    runner = ProjectionRunner(log, all_projections())
    try:
        await runner.start()
    except BaseException:
        await log.close()
        raise
    app = Blazar(paths=paths, log=log, runner=runner, clock=clock, actor=actor or default_actor(env),
                 env=dict(os.environ if env is None else env))
    app.folded_at_start = runner.folded_at_start
    runner.checkpoint_every = app.settings().checkpoint_every
    logging.getLogger("blazar").setLevel(app.settings().log_level.upper())
    loose = loose_modes(paths)
    if loose:
        logging.getLogger("blazar").warning("files others can read under the Blazar home: %s; fix with `chmod 600` "
                                            "(files) or `chmod 700` (directories)", ", ".join(loose))
    if reconcile_config:
        try:
            await reconcile_file(app)
        except BaseException:
            await app.close()
            raise
    return app
