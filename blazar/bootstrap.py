"""The composition root: the one place that reads the environment and wires paths, log, projections, handlers and
adapters together. Only the CLI and the daemon import it; everything below receives what it built.

    bootstrap()       the context (blazar/context.py): paths, the log, projections caught up, config reconciled
    build_services()  what the daemon serves with: the Supervisor, admission, the engine client, the Gateway
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from blazar.clock import Clock, SystemClock
from blazar.cluster.nodes import node_name
from blazar.context import CHECKPOINT_ON_CLOSE_AFTER, Blazar
from blazar.events.log import EventLog
from blazar.logdb import archive_location, log_location, open_log
from blazar.operations.config import reconcile_file
from blazar.paths import Paths
from blazar.projections import all_projections
from blazar.projections.runner import ProjectionRunner
from blazar.queries.file_modes import loose_modes

if TYPE_CHECKING:
    from blazar.adapters.engines.client import EngineClient
    from blazar.adapters.hub import Hub
    from blazar.adapters.otel.metrics_loop import MetricsLoop
    from blazar.adapters.otel.tracing import Tracing
    from blazar.serving.gateway import Gateway
    from blazar.serving.ports import SupervisorPort

__all__ = ["CHECKPOINT_ON_CLOSE_AFTER", "Blazar", "Services", "bootstrap", "build_services", "default_actor",
           "paths_from_env"]

PRIVATE_UMASK = 0o077
# Seconds a stopping daemon waits for its last request events to commit before it closes the OTLP exports.
TRACING_FLUSH_S = 5.0


def paths_from_env(env: Mapping[str, str] | None = None) -> Paths:
    """The home's paths from `env` (None: this process's environment, read here, as everything else does)."""
    return Paths.from_env(os.environ if env is None else env)


def default_actor(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    try:
        user = env.get("USER") or getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"cli:{user}"


def _hub_from_env(env: Mapping[str, str]) -> Hub:
    from blazar.adapters.hub import hub_from_env  # huggingface_hub costs 0.2 s to import: only when used

    return hub_from_env(env)


async def bootstrap(
    *,
    paths: Paths | None = None,
    env: Mapping[str, str] | None = None,
    actor: str | None = None,
    clock: Clock | None = None,
    reconcile_config: bool = True,
) -> Blazar:
    """Open the log (migrating it), catch projections up, and notice hand edits of config.toml."""
    # NOTE: every file and directory this process creates is the owner's alone (db, WAL, config, run/, log/,
    # snapshots, exports, engine builds): one umask rather than a mode at each of the places that write.
    os.umask(PRIVATE_UMASK)
    paths = paths or paths_from_env(env)
    paths.ensure()
    clock = clock or SystemClock()
    location = log_location(paths, os.environ if env is None else env)
    # A shared log (PostgreSQL): this home is one node among the gateways that may share it.
    node = node_name(paths, os.environ if env is None else env) if location.shared else ""
    log = await open_log(location, clock=clock, archive=archive_location(paths, os.environ if env is None else env))
    runner = ProjectionRunner(log, all_projections(), node=node)
    try:
        await runner.start()
    except BaseException:
        await log.close()
        raise
    app = Blazar(paths=paths, log=log, runner=runner, clock=clock, actor=actor or default_actor(env),
                 env=dict(os.environ if env is None else env), hub_factory=_hub_from_env)
    app.folded_at_start = runner.folded_at_start
    app.node = node
    runner.checkpoint_every = app.settings().log.checkpoint_every
    log.max_event_bytes = app.settings().log.event_max_kib << 10
    logging.getLogger("blazar").setLevel(app.settings().telemetry.log_level.upper())
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


async def open_log_only(*, paths: Paths | None = None, env: Mapping[str, str] | None = None,
                        clock: Clock | None = None) -> EventLog:
    """The home's log (with its archive directory), opened without folding any projection: for the checks that
    must answer when a fold would stop on the very damage they look for (`blazar audit verify --archive`)."""
    os.umask(PRIVATE_UMASK)
    paths = paths or paths_from_env(env)
    paths.ensure()
    environ = os.environ if env is None else env
    return await open_log(log_location(paths, environ), clock=clock or SystemClock(),
                          archive=archive_location(paths, environ))


@dataclass
class Services:
    """What the daemon serves with, built once: the children's supervisor and the request pipeline over it."""

    supervisor: SupervisorPort
    gateway: Gateway
    client: EngineClient
    tracing: Tracing | None = None  # the OTLP span export, where a collector is configured
    metrics: MetricsLoop | None = None  # the OTLP metrics export, likewise (unless `otlp_metrics` is off)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _batches: asyncio.Task[None] | None = None

    def start(self, stopping: asyncio.Event | None = None) -> None:
        """The daemon's background work beside serving: the remote engines' health checks, the speculation and
        adaptive slots governors, the archiver (request history past `request_retention` into segments, every
        `archive_every_s`), the batch runner (which starts no line once `stopping` is set)."""
        from blazar.api.batches import line_asker
        from blazar.cluster.remotes import health_loop
        from blazar.operations.archive_schedule import archive_loop
        from blazar.serving.batches import BatchRunner

        self._tasks.append(asyncio.create_task(health_loop(self.gateway.app, self.gateway.remotes),
                                               name="blazar-remote-health"))
        self._tasks.append(asyncio.create_task(archive_loop(self.gateway.app), name="blazar-archiver"))
        self._tasks.append(asyncio.create_task(self.gateway.spec.run(), name="blazar-spec-governor"))
        self._tasks.append(asyncio.create_task(self.gateway.slots.run(), name="blazar-slots-governor"))
        ask, build = line_asker(self.gateway)
        runner = BatchRunner(self.gateway.app, self.gateway, ask, build=build, stopping=stopping)
        self._batches = asyncio.create_task(runner.run(), name="blazar-batches")
        if self.metrics is not None:
            self._tasks.append(asyncio.create_task(self.metrics.run(), name="blazar-otlp-metrics"))

    async def stop_batches(self) -> None:
        """Before the engines stop: the lines in flight end unrecorded (they run again after a restart) rather than
        fail on an engine going away."""
        if self._batches is not None:
            self._batches.cancel()
            await asyncio.gather(self._batches, return_exceptions=True)
            self._batches = None

    async def close(self) -> None:
        await self.stop_batches()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.aclose()
        if self.tracing is None and self.metrics is None:
            return
        with contextlib.suppress(TimeoutError):  # the last requests' events reach the spans and counters first
            async with asyncio.timeout(TRACING_FLUSH_S):
                await self.gateway.app.request_writer().flush()
        closing = []
        if self.tracing is not None:
            closing.append(asyncio.to_thread(self.tracing.close))  # bounded: a hanging collector is left behind
        if self.metrics is not None:
            closing.append(self.metrics.close())  # the last values, bounded likewise
        await asyncio.gather(*closing)


def build_services(app: Blazar, *, supervisor: SupervisorPort | None = None,
                   client: EngineClient | None = None) -> Services:
    """The Supervisor (or the one given: tests pass fakes here), admission limits from the settings, the engine
    client and the Gateway that joins them.

    NOTE: the serving stack is imported here, not at the top: every CLI command imports this module for
    `bootstrap()`, and only the daemon serves (importing it all cost each command about a second of CPU)."""
    from blazar.adapters.energy import EnergyMeter
    from blazar.adapters.engines.client import EngineClient
    from blazar.instances.kv_bank import KvBank
    from blazar.instances.supervisor import Supervisor
    from blazar.serving.admission import Admission
    from blazar.serving.energy import EnergyLedger
    from blazar.serving.gateway import Gateway

    settings = app.settings()
    engine = client if client is not None else EngineClient()
    kv = KvBank(app, engine)  # which slot holds which session; their saves when an instance goes
    sup = supervisor if supervisor is not None else Supervisor(app, kv_bank=kv)
    admission = Admission(queue_depth=settings.queue.queue_depth, global_cap=settings.queue.max_concurrent_requests,
                          wait_timeout_s=settings.queue.queue_timeout_s, fair_share=settings.queue.fair_share)
    meter = EnergyMeter()  # probed once: a machine without readable counters is never read again
    logging.getLogger("blazar.daemon").info("energy per request: %s", meter.describe())
    energy = EnergyLedger(meter)
    gateway = Gateway(app, sup, admission, engine, kv, energy)
    tracing = _tracing(app)  # first: the metrics export reads its counters
    return Services(supervisor=sup, gateway=gateway, client=engine, tracing=tracing, metrics=_metrics(app, gateway))


def _tracing(app: Blazar) -> Tracing | None:
    """Request spans exported over OTLP/HTTP when `otlp_endpoint` (or OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT) names
    a collector; the SDK is imported only then."""
    from blazar.adapters.otel.target import otlp_target

    target = otlp_target(app.settings(), app.env)
    if target is None:
        return None
    from blazar.adapters.otel.tracing import start_tracing

    tracing = start_tracing(app.log, target)
    app.span_export_stats = tracing.stats
    return tracing


def _metrics(app: Blazar, gateway: Gateway) -> MetricsLoop | None:
    """/metrics' families exported over OTLP/HTTP every `otlp_metrics_interval_s` to the spans' collector (its
    /v1/metrics), unless `otlp_metrics` is off; the SDK is imported only then."""
    from blazar.adapters.otel.target import otlp_target

    settings = app.settings()
    target = otlp_target(settings, app.env, "metrics")
    if target is None:
        if settings.telemetry.otlp_metrics and settings.telemetry.otlp_endpoint and \
                otlp_target(settings, app.env) is not None:
            logging.getLogger("blazar.otel").warning(
                "otlp_endpoint %s has a path of its own: where metrics go beside it cannot be told, so none are "
                "exported (OTEL_EXPORTER_OTLP_METRICS_ENDPOINT names their URL)", settings.telemetry.otlp_endpoint)
        return None
    from blazar.adapters.otel.metrics_loop import start_metrics
    from blazar.queries.metrics import daemon_families

    metrics = start_metrics(target, lambda: daemon_families(app, gateway.admission.snapshot()),
                            settings.telemetry.otlp_metrics_interval_s)
    app.metric_export_stats = metrics.stats
    return metrics
