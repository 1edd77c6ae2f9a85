"""The context every command runs in: where files are, the log, the live projections, the clock and who is acting.
`blazar.bootstrap` builds it (the composition root); handlers, queries and the api receive it and never build one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from blazar import config as settings
from blazar.clock import Clock
from blazar.events.base import Event, NodeLocal, Recorded
from blazar.events.log import EventLog
from blazar.events.writer import GroupCommitWriter
from blazar.paths import Paths
from blazar.projections.config import overrides as config_overrides
from blazar.projections.runner import ProjectionRunner

if TYPE_CHECKING:
    from blazar.adapters.hub import Hub

# A CLI command that had to fold more than this many events at start leaves a checkpoint behind on close.
CHECKPOINT_ON_CLOSE_AFTER = 1_000


def stamp_node(event: Event, node: str) -> Event:
    """A node-local event names the node it happened on (where several gateways share the log)."""
    if isinstance(event, NodeLocal) and not event.node:
        return event.model_copy(update={"node": node})
    return event


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
    # The Hugging Face hub client, made on first use by what the composition root gave (None: no hub configured).
    hub_factory: Callable[[Mapping[str, str]], Hub] | None = None
    _hub: Hub | None = None
    # The OTLP span export's counters (exported, failed, dropped, queued), where the daemon exports spans.
    span_export_stats: Callable[[], Mapping[str, int]] | None = None
    # The OTLP metrics export's counters (exported, failed, skipped), where the daemon exports metrics.
    metric_export_stats: Callable[[], Mapping[str, int]] | None = None
    # This gateway's node name where several share the log (on PostgreSQL); "" with the embedded SQLite log.
    node: str = ""
    # The settings last built, with the overrides they were built from: rebuilt only when a `config.changed` changed
    # those (validating every setting took a request ~0.1 ms each time it asked).
    _settings: tuple[dict[str, Any], settings.Settings] | None = field(default=None, repr=False)

    async def record(self, events: Event | Sequence[Event], *, cause: int | None = None) -> list[Recorded]:
        """Durable append (committed before this returns) and catch-up, so the caller reads its own writes."""
        if self.node:
            events = [stamp_node(e, self.node) for e in ([events] if isinstance(events, Event) else events)]
        recorded = await self.log.append(events, actor=self.actor, cause=cause)
        if recorded:
            # catch_up (not apply) so events other processes appended meanwhile are folded in seq order too.
            await self.runner.catch_up()
        return recorded

    def request_writer(self) -> GroupCommitWriter:
        """The group-commit writer for request events, started on first use with `group_commit_ms` from config;
        `close()` drains it."""
        if self.writer is None:
            self.writer = GroupCommitWriter(self.log, interval=self.settings().log.group_commit_ms / 1000)
            self.writer.start()
        return self.writer

    def hub(self) -> Hub:
        """The Hugging Face hub client, configured from HF_ENDPOINT and HF_TOKEN as they were at start."""
        if self._hub is None:
            if self.hub_factory is None:
                raise RuntimeError("this context was built without a hub (bootstrap gives one)")
            self._hub = self.hub_factory(self.env)
        return self._hub

    def overrides(self) -> dict[str, Any]:
        return config_overrides(self.runner.state("config"))

    def settings(self) -> settings.Settings:
        known = {k: v for k, v in self.overrides().items() if k in settings.FIELDS}
        if self._settings is None or self._settings[0] != known:
            self._settings = (known, settings.build(known))
        return self._settings[1]

    async def close(self) -> None:
        if self.writer is not None:
            await self.writer.stop()
        await self.runner.stop(checkpoint=self.folded_at_start >= CHECKPOINT_ON_CLOSE_AFTER)
        await self.log.close()
