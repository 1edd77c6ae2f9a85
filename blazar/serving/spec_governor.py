"""The speculation governor: off the request path, one background task watches every instance that runs a speculative
posture (Instance.posture.speculative), in windows of `spec_window_s`. Each window it samples the instance's demand
(requests in flight and queued, from admission) a few times and, at its end, reads the engine's `/metrics` counters
(tokens drafted and accepted, tokens predicted and the seconds they took); the rule (spec_rule.py) turns speculation
off or back on, and each switch is recorded as `spec.switched` with the window's numbers. The child is never
restarted: a request routed to an instance whose speculation is off is sent `"speculative.n_max": 0`
(`request_spec`, a dictionary read on the request path).

    Services.start ─► SpecGovernor.run ─► every tick: demand sampled ─► window end: /metrics, decide_spec, record
    Admitter._admit ─► request_spec(instance, client's X-Blazar-Spec) ─► "on" | "off_client" | "off_governor"
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Literal

from blazar.adapters.engines.client import EngineClient
from blazar.context import Blazar
from blazar.errors import EngineUnreachable
from blazar.events.tuning import SpecSwitched
from blazar.instances.supervisor import Instance
from blazar.serving.admission import Admission
from blazar.serving.ports import SupervisorPort
from blazar.serving.spec_rule import SpecRule, SpecState, SpecWindow, decide_spec

log = logging.getLogger("blazar.spec")

SAMPLES_PER_WINDOW = 5
MIN_TICK_S = 0.05
IDLE_TICK_S = 1.0  # how often a governor that is switched off (spec_governor false) looks again
METRICS_TIMEOUT_S = 5.0
# The engine's counters the window reads (llama-server /metrics, "llamacpp:" dropped).
DRAFTED, ACCEPTED = "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total"
PREDICTED, PREDICTED_S = "tokens_predicted_total", "tokens_predicted_seconds_total"
COUNTERS = (DRAFTED, ACCEPTED, PREDICTED, PREDICTED_S)
# What the engine is sent for a request that must not draft (llama-server's per-request field).
N_MAX_FIELD = "speculative.n_max"

RequestSpec = Literal["on", "off_client", "off_governor"]


@dataclass
class _Watch:
    """One speculative instance: the rule's state and the window under way."""

    state: SpecState = field(default_factory=SpecState)
    base: dict[str, float] | None = None  # the counters at the window's start (None: not read yet)
    started: float = 0.0
    samples: int = 0
    saturated: int = 0
    peak: int = 0

    def restart(self, counters: dict[str, float], now: float) -> None:
        self.base, self.started, self.samples, self.saturated, self.peak = counters, now, 0, 0, 0


def rule_of(app: Blazar) -> SpecRule:
    s = app.settings().speculation
    return SpecRule(window_s=s.spec_window_s, min_acceptance=s.spec_min_acceptance, min_drafted=s.spec_min_drafted,
                    reprobe_s=s.spec_reprobe_s)


class SpecGovernor:
    def __init__(self, app: Blazar, supervisor: SupervisorPort, admission: Admission, client: EngineClient) -> None:
        self.app = app
        self.supervisor = supervisor
        self.admission = admission
        self.client = client
        self._watches: dict[str, _Watch] = {}

    # -- the request path: a dictionary read --------------------------------------------------------------------

    def request_spec(self, inst: Instance, asked: str | None) -> RequestSpec | None:
        """Whether a request on `inst` may draft: None when the instance does not speculate at all; off when the
        client asked (`X-Blazar-Spec: off`) or the governor turned it off."""
        if inst.remote or inst.posture is None or not inst.posture.speculative:
            return None
        if asked == "off":
            return "off_client"
        watch = self._watches.get(inst.instance_id)
        return "off_governor" if watch is not None and not watch.state.enabled else "on"

    def states(self) -> dict[str, SpecState]:
        """Each watched instance's verdict (for metrics and tests)."""
        return {iid: w.state for iid, w in self._watches.items()}

    # -- the background task ------------------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            if not self.app.settings().speculation.spec_governor:
                self._watches.clear()  # every instance speculates as started
                await asyncio.sleep(IDLE_TICK_S)
                continue
            rule = rule_of(self.app)
            await asyncio.sleep(max(MIN_TICK_S, rule.window_s / SAMPLES_PER_WINDOW))
            try:
                await self.tick(rule)
            except asyncio.CancelledError:
                raise
            except Exception:  # NOTE: the governor must outlive any one bad reading; the next tick tries again
                log.exception("speculation governor tick failed")

    async def tick(self, rule: SpecRule) -> None:
        """One sample of every speculative instance's demand; the windows that are over judged."""
        instances = {i.instance_id: i for i in self.supervisor.instances()
                     if not i.remote and i.posture is not None and i.posture.speculative}
        for gone in set(self._watches) - set(instances):
            del self._watches[gone]
        if not instances:
            return
        lanes = self.admission.snapshot()
        now = self.app.clock.monotonic()
        for iid, inst in instances.items():
            watch = self._watches.setdefault(iid, _Watch())
            if watch.base is None:
                counters = await self._counters(inst)
                if counters is not None:
                    watch.restart(counters, now)
                continue
            lane = lanes.get(inst.lane, {})
            demand = int(lane.get("busy", 0)) + int(lane.get("queued", 0))
            watch.samples += 1
            watch.saturated += demand > inst.slots
            watch.peak = max(watch.peak, demand)
            if now - watch.started >= rule.window_s:
                await self._judge(inst, watch, rule, now)

    async def _counters(self, inst: Instance) -> dict[str, float] | None:
        try:
            got = await self.client.metrics(inst.base_url, api_key=inst.api_key, timeout_s=METRICS_TIMEOUT_S)
        except EngineUnreachable as e:
            log.debug("speculation governor: %s: %s", inst.instance_id, e)
            return None  # starting, or on its way out: the next tick tries again
        return {name: got.get(name, 0.0) for name in COUNTERS}

    async def _judge(self, inst: Instance, watch: _Watch, rule: SpecRule, now: float) -> None:
        counters = await self._counters(inst)
        if counters is None or watch.base is None:
            return
        delta = {name: counters[name] - watch.base[name] for name in COUNTERS}
        if any(v < 0 for v in delta.values()):  # the counters went back: start a fresh window
            watch.restart(counters, now)
            return
        window = SpecWindow(duration_s=now - watch.started, drafted=int(delta[DRAFTED]),
                            accepted=int(delta[ACCEPTED]), predicted=int(delta[PREDICTED]),
                            predicted_s=delta[PREDICTED_S], samples=watch.samples, saturated=watch.saturated,
                            peak_demand=watch.peak, slots=inst.slots)
        watch.state, switch = decide_spec(watch.state, window, rule, now)
        watch.restart(counters, now)
        if switch is None:
            return
        tps = window.decode_tps
        acceptance = window.acceptance
        await self.app.record(SpecSwitched(
            instance_id=inst.instance_id, model=inst.model, enabled=switch.enabled, reason=switch.reason,
            window_s=round(window.duration_s, 3), drafted=window.drafted, accepted=window.accepted,
            acceptance=round(acceptance, 4) if acceptance is not None else None,
            decode_tps=round(tps, 2) if tps is not None else None, in_flight=window.peak_demand,
            slots=window.slots))
