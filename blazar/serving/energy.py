"""Energy per request: the machine's counters (blazar/adapters/energy.py: RAPL, NVML) read when a request arrives and
when it ends, nothing per token. The counters are machine-wide, so a request is charged its share: between any two
reads, the joules the machine used are split evenly among the requests in flight then. A running sum of those shares
(joules per request in flight, like a scheduler's virtual time) makes that O(1) per request: a request's share is the
sum at its end less the sum at its start, and the shares of overlapping requests add up to the machine's joules over
their spans. What the machine does besides serving (idle draw, other programs) is in those joules too.

A machine without a readable counter is found once, at start: then nothing is read, ever, and every request says
`not_measured`; a counter that stops reading mid-way turns measuring off the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from blazar.adapters.energy import EnergyMeter, Reading
from blazar.events.requests import EnergySource, RequestEnergy

NOT_MEASURED = RequestEnergy(source="not_measured")


@dataclass(frozen=True, slots=True)
class Mark:
    """Where the ledger stood when a request arrived."""

    share_j: float  # the running sum of per-request shares
    machine_j: float  # the machine's joules while any request was in flight
    overlapped: int  # requests in flight then, this one included
    starts: int  # requests started so far, this one included


@dataclass(frozen=True, slots=True)
class Span:
    """One request's span in a ledger (`mark` None: not measured); `end` it exactly once."""

    ledger: EnergyLedger
    mark: Mark | None

    def end(self, completion_tokens: int | None) -> RequestEnergy:
        return self.ledger.end(self.mark, completion_tokens)


class EnergyLedger:
    """Shares of the machine's energy among the requests in flight; `meter` None: this machine measures none."""

    def __init__(self, meter: EnergyMeter | None = None) -> None:
        self.meter = meter
        self.source: EnergySource = "not_measured"
        if meter is not None:
            parts = (["rapl"] if meter.rapl.zones else []) + (["nvml"] if meter.nvml.gpus else [])
            self.source = "rapl+nvml" if len(parts) == 2 else "rapl" if parts == ["rapl"] else \
                "nvml" if parts else "not_measured"
        if self.source == "not_measured":
            self.meter = None
        self._last: Reading | None = None
        self._in_flight = 0
        self._share_j = 0.0
        self._machine_j = 0.0
        self._starts = 0

    @property
    def measuring(self) -> bool:
        return self.meter is not None

    def begin(self) -> Span:
        """A request arrived: its span starts (unmeasured when nothing is)."""
        if self.meter is None or not self._advance():
            return Span(self, None)
        self._in_flight += 1
        self._starts += 1
        return Span(self, Mark(self._share_j, self._machine_j, self._in_flight, self._starts))

    def end(self, span: Mark | None, completion_tokens: int | None) -> RequestEnergy:
        """A request's span ended (every one that began ends exactly once): its share of the machine's energy."""
        if span is None:
            return NOT_MEASURED
        advanced = self.meter is not None and self._advance()
        self._in_flight -= 1
        if not advanced:
            return NOT_MEASURED
        joules = self._share_j - span.share_j
        tokens = completion_tokens or 0
        return RequestEnergy(source=self.source, joules=round(joules, 3),
                             machine_joules=round(self._machine_j - span.machine_j, 3),
                             tokens_per_joule=round(tokens / joules, 3) if joules > 0 else None,
                             overlapped=span.overlapped + self._starts - span.starts)

    def _advance(self) -> bool:
        """Read the counters and share what the machine used since the last read among the requests in flight; False
        (and measuring off from now on) when they no longer read."""
        assert self.meter is not None
        now = self.meter.read()
        if self._last is not None:
            joules = self.meter.joules(self._last, now)
            if joules is None:
                self.meter = None
                return False
            if self._in_flight:
                self._share_j += joules / self._in_flight
                self._machine_j += joules
        elif not (now.rapl_uj or now.nvml_mj):
            self.meter = None
            return False
        self._last = now
        return True
