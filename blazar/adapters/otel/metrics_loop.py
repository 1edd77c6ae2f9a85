"""When /metrics' families go out over OTLP: every `interval_s`, the families are taken on the event loop (what a
scrape of /metrics costs: the projections are folded there, and a histogram's counts change in place) and handed to
a thread of their own that collects and sends them (metrics.py). The loop never waits on the collector: a send still
out when the next is due makes that one skip (counted), and a collector that hangs holds one thread, bounded by the
exporter's timeout. `close` sends the last values, within a bound. Only the composition root makes one
(`start_metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

from opentelemetry.sdk.metrics.export import MetricExporter

from blazar.adapters.otel.metrics import FamilyExport
from blazar.adapters.otel.target import OtlpTarget
from blazar.metric_families import Family

log = logging.getLogger("blazar.otel")

# Seconds one export may take (the exporter's own retries included) before it counts as failed.
EXPORT_TIMEOUT_S = 10.0
# Seconds `close` gives the last values to reach the collector when the daemon stops.
CLOSE_TIMEOUT_S = 5.0


class MetricsLoop:
    def __init__(self, export: FamilyExport, families: Callable[[], list[Family]], interval_s: float,
                 target: OtlpTarget | None = None) -> None:
        self.export = export
        self.families = families
        self.interval_s = interval_s
        self.target = target
        self.skipped = 0  # exports not started: the one before was still out
        self._out: threading.Thread | None = None

    async def run(self) -> None:
        """Export every `interval_s` until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.send(EXPORT_TIMEOUT_S)
            except Exception:  # the families could not be taken: say so, and try again at the next tick
                log.exception("taking the metric families for OTLP failed")

    async def send(self, timeout_s: float) -> bool:
        """One export of the families now; False when one was still out (skipped) or this one did not end within
        `timeout_s` (it goes on in its thread). The export's own failures are counted by `export.sink`."""
        if self._out is not None and self._out.is_alive():
            self.skipped += 1
            return False
        families = self.families()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def finished() -> None:
            if not done.done():
                done.set_result(None)

        def work() -> None:
            try:
                self.export.export(families, EXPORT_TIMEOUT_S)
            except Exception:  # an SDK error must not stay silent in a thread nobody joins
                log.exception("collecting metrics for OTLP failed")
            finally:
                with contextlib.suppress(RuntimeError):  # the loop closed while a hanging export went on
                    loop.call_soon_threadsafe(finished)

        # NOTE: a daemon thread, not an executor's: a collector that hangs must not hold the process at exit.
        self._out = threading.Thread(target=work, name="blazar-otlp-metrics", daemon=True)
        self._out.start()
        try:
            async with asyncio.timeout(timeout_s):
                await done
        except TimeoutError:
            return False
        return True

    def stats(self) -> dict[str, int]:
        return {"exported": self.export.sink.exported, "failed": self.export.sink.failed, "skipped": self.skipped}

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """The last values out (the run task cancelled before), then the exporter shut, all within `timeout_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if self._out is not None and self._out.is_alive():  # the last periodic export first
            await asyncio.to_thread(self._out.join, timeout_s)
        sent = await self.send(max(0.1, deadline - loop.time()))
        if sent:
            left = max(0.1, deadline - loop.time())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await asyncio.to_thread(self.export.shutdown, left)


def start_metrics(target: OtlpTarget, families: Callable[[], list[Family]], interval_s: float, *,
                  exporter: MetricExporter | None = None) -> MetricsLoop:
    """The export towards `target` (or `exporter`, in tests), its instruments made from `families()` now (every
    family is announced even before it has a value). The caller runs `run()` as a task."""
    from blazar import __version__
    from blazar.adapters.otel.tracing import quiet_sdk_logs, resource_for

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        exporter = OTLPMetricExporter(endpoint=target.endpoint, headers=target.headers, timeout=EXPORT_TIMEOUT_S)
    quiet_sdk_logs("opentelemetry.exporter.otlp.proto.http.metric_exporter")
    metrics = MetricsLoop(FamilyExport(exporter, resource_for(__version__), families()), families, interval_s, target)
    log.info("exporting metrics every %g s to %s (%s)", interval_s, target.endpoint, target.source)
    return metrics
