"""The shipped workloads a bench measures (blazar/tuning/measure.py): free multi-turn chat, code editing (a file echoed
back with one change: the repetitive case n-gram speculation is for) and a question over a long document (prefill
bound, short answer). Fixed and deterministic: the same requests, greedy, every run, so two benches compare.

The code and document requests are raw completions framed for a base model that continues text: the continuation
of the code prompt is the file again; the document prompt ends at "Answer:". Chat goes through the chat template.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from blazar.events.tuning import Workload

WORKLOADS: tuple[Workload, ...] = ("chat", "code", "long")


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload: chat `messages` (/v1/chat/completions) or a raw `prompt` (/v1/completions)."""

    max_tokens: int
    messages: tuple[tuple[str, str], ...] = ()  # (role, content)
    prompt: str | None = None

    @property
    def path(self) -> str:
        return "/v1/completions" if self.prompt is not None else "/v1/chat/completions"

    def body(self, *, model: str, max_tokens: int | None = None) -> dict[str, Any]:
        """The engine body: streamed, greedy, a fixed seed, the engine's timings in the last chunk. `max_tokens`
        caps the workload's own."""
        n = self.max_tokens if max_tokens is None else min(self.max_tokens, max_tokens)
        body: dict[str, Any] = {"model": model, "max_tokens": n, "stream": True, "temperature": 0.0, "seed": 7,
                                "stream_options": {"include_usage": True},
                                # every request prefills its whole prompt: no reuse of an earlier request's KV,
                                # so a round measures the same work whatever ran before it
                                "cache_prompt": False}
        if self.prompt is not None:
            body["prompt"] = self.prompt
        else:
            body["messages"] = [{"role": r, "content": c} for r, c in self.messages]
        return body


@dataclass(frozen=True)
class WorkloadSpec:
    name: Workload
    description: str
    requests: tuple[BenchRequest, ...] = field(default_factory=tuple)


def workload(name: str) -> WorkloadSpec:
    """The shipped workload `name`; ValueError names the ones there are."""
    try:
        return _WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r} (one of: {', '.join(WORKLOADS)})") from None


# -- chat: free text over a few turns ----------------------------------------------------------------------------

_CHATS: tuple[tuple[tuple[str, str], ...], ...] = (
    (("user", "I am planning a week of walking in the hills in late spring. What should I pack?"),
     ("assistant", "Good boots you have already worn in, layers rather than one heavy coat, a waterproof shell, a hat, "
                   "a map and compass, and enough water for the longest day."),
     ("user", "What about food for the long days, and how do I keep my feet in good shape?")),
    (("user", "Tell me a short story about a lighthouse keeper who finds a message in a bottle."),),
    (("user", "My tomato plants have yellow leaves at the bottom. What could be wrong?"),
     ("assistant", "Lower leaves yellowing is often a sign of too much water, a lack of nitrogen, or an early fungal "
                   "disease. How often do you water them, and are there spots on the leaves?"),
     ("user", "I water them every day and there are some brown spots with rings. What should I do now?")),
)

# -- code: a source file echoed back with one change --------------------------------------------------------------

_SOURCE = '''\
"""A small inventory of parts kept in bins, with reorder rules."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Part:
    sku: str
    name: str
    qty: int
    reorder_at: int
    bin_id: str
    tags: list[str] = field(default_factory=list)

    def needs_reorder(self) -> bool:
        return self.qty <= self.reorder_at

    def take(self, count: int) -> None:
        if count <= 0:
            raise ValueError("count must be positive")
        if count > self.qty:
            raise ValueError(f"only {self.qty} of {self.sku} left")
        self.qty -= count

    def put(self, count: int) -> None:
        if count <= 0:
            raise ValueError("count must be positive")
        self.qty += count


class Inventory:
    def __init__(self) -> None:
        self.parts: dict[str, Part] = {}

    def add(self, part: Part) -> None:
        if part.sku in self.parts:
            raise KeyError(f"{part.sku} is already stocked")
        self.parts[part.sku] = part

    def get(self, sku: str) -> Part:
        try:
            return self.parts[sku]
        except KeyError:
            raise KeyError(f"no part {sku}") from None

    def take(self, sku: str, count: int) -> None:
        self.get(sku).take(count)

    def put(self, sku: str, count: int) -> None:
        self.get(sku).put(count)

    def reorder_list(self) -> list[Part]:
        return sorted((p for p in self.parts.values() if p.needs_reorder()), key=lambda p: p.sku)

    def in_bin(self, bin_id: str) -> list[Part]:
        return [p for p in self.parts.values() if p.bin_id == bin_id]

    def tagged(self, tag: str) -> list[Part]:
        return [p for p in self.parts.values() if tag in p.tags]

    def total_units(self) -> int:
        return sum(p.qty for p in self.parts.values())

    def report(self) -> str:
        lines = [f"{p.sku:<10} {p.name:<24} {p.qty:>5} {p.bin_id}" for p in self.parts.values()]
        lines.append(f"{'total':<35} {self.total_units():>5}")
        return "\\n".join(lines)


def load(rows: list[dict[str, str]]) -> Inventory:
    inv = Inventory()
    for row in rows:
        inv.add(Part(sku=row["sku"], name=row["name"], qty=int(row["qty"]),
                     reorder_at=int(row["reorder_at"]), bin_id=row["bin"],
                     tags=[t for t in row.get("tags", "").split(";") if t]))
    return inv
'''

# (the change asked for, the edited file's first lines): the model continues the edited file, mostly a copy.
_EDITS: tuple[tuple[str, int], ...] = (
    ("add a docstring to Part.take", 20),
    ("rename Inventory.tagged to Inventory.with_tag", 8),
    ("make Inventory.report sort its lines by sku", 12),
)


def _code_prompt(change: str, head_lines: int) -> str:
    head = "\n".join(_SOURCE.splitlines()[:head_lines])
    return (f"### inventory.py (before)\n```python\n{_SOURCE}```\n\n"
            f"### inventory.py (after: {change}; every other line unchanged)\n```python\n{head}\n")


# -- long: a question over a long document -------------------------------------------------------------------------

_STATIONS = ("Alder Ridge", "Brackenford", "Cold Harbour", "Dunmere", "Eastwick Fen", "Fallow Cross", "Greyscar",
             "Hollin Bank")
_MONTHS = ("January", "February", "March", "April", "May", "June")


def _document() -> str:
    """A weather service's half-year report: eight stations, six months each, numbers from a fixed formula (no
    randomness), one fact the question asks about placed in the middle."""
    parts = ["Regional Weather Service: station report for the first half of the year.\n",
             "Each station reports its total rainfall, its warmest day and the number of days with frost. "
             "Readings are checked by the duty officer before they are entered here.\n"]
    for i, station in enumerate(_STATIONS):
        parts.append(f"\n{station} station (number {i + 1}).\n")
        for m, month in enumerate(_MONTHS):
            rain = 20 + (i * 37 + m * 11) % 90
            warm = 4 + (i * 7 + m * 5) % 12 + m * 2
            frost = max(0, 12 - m * 2 - (i % 5))
            parts.append(f"In {month} {station} recorded {rain} millimetres of rain, a warmest day of {warm} degrees "
                         f"and {frost} days of frost.")
            if i == 4 and m == 2:
                parts.append(" A storm on the fourteenth brought down the mast, and the duty officer that month "
                             "was Margaret Ilsley, who kept the readings by hand until it was repaired.")
            parts.append(" ")
    return "".join(parts)


_DOCUMENT = _document()
_QUESTIONS = ("Who was the duty officer at Eastwick Fen station when the mast came down?",
              "How many millimetres of rain did Alder Ridge station record in January?",
              "Which month brought down the mast at Eastwick Fen station?")


def _long_prompt(question: str) -> str:
    return f"{_DOCUMENT}\n\nQuestion: {question}\nAnswer:"


_WORKLOADS: dict[str, WorkloadSpec] = {
    "chat": WorkloadSpec("chat", "multi-turn chat, free text",
                         tuple(BenchRequest(max_tokens=96, messages=c) for c in _CHATS)),
    "code": WorkloadSpec("code", "code editing: an 80-line file echoed back with one change",
                         tuple(BenchRequest(max_tokens=160, prompt=_code_prompt(c, n)) for c, n in _EDITS)),
    "long": WorkloadSpec("long", "a question over a long document (~1600 tokens), short answer",
                         tuple(BenchRequest(max_tokens=16, prompt=_long_prompt(q)) for q in _QUESTIONS)),
}
