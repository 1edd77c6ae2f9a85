"""Crash safety of the log: a child process appends in a loop and is SIGKILLed mid-loop, a few times over.

What it acknowledged must be there exactly as acknowledged, the seqs gap-free across every crash, the
database intact and every row decodable (no torn record). Through the group-commit writer, a crash may lose
the batch not yet flushed, never one whose flush returned.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest

from blazar.events import Event, register
from blazar.events.log_sqlite import SqliteEventLog
from tests.support.bounds import HANG_S

pytestmark = pytest.mark.slow(reason="crash loops: writer children killed mid-burst, again and again")

ROOT = Path(__file__).resolve().parents[2]
BURST = 25  # events the writer child submits between flushes


@register
class _Probed(Event):
    """What the child appends; its copy in CHILD below must keep the same fields (decoding forbids extras)."""

    TYPE: ClassVar[str] = "crashtest.probed"
    round: int
    n: int
    token: str


CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    from pathlib import Path
    from typing import ClassVar

    from blazar.events import Event, register
    from blazar.events.log_sqlite import SqliteEventLog
    from blazar.events.writer import GroupCommitWriter

    @register
    class Probed(Event):
        TYPE: ClassVar[str] = "crashtest.probed"
        round: int
        n: int
        token: str

    def probe(round_: int, n: int) -> Probed:
        # Payloads of varying size, so records straddle pages differently from one event to the next.
        return Probed(round=round_, n=n, token=f"r{round_}-n{n}-" + "x" * (n * 37 % 300))

    async def main(db: str, round_: int, mode: str, limit: int, seconds: float, burst: int) -> None:
        log = await SqliteEventLog.open(Path(db))
        deadline = time.monotonic() + seconds  # bounded even if the parent never kills us
        print("ready", flush=True)
        n = 0
        if mode == "durable":
            while n < limit and time.monotonic() < deadline:
                ev = probe(round_, n)
                (rec,) = await log.append(ev, actor="crashtest")
                print(f"ack {rec.seq} {ev.token}", flush=True)  # only after the append returned
                n += 1
        else:
            writer = GroupCommitWriter(log, interval=0.002)
            writer.start()
            while n < limit and time.monotonic() < deadline:
                tokens = []
                for _ in range(burst):
                    ev = probe(round_, n)
                    writer.submit(ev, actor="crashtest")
                    tokens.append(ev.token)
                    n += 1
                await writer.flush()
                print("ack " + " ".join(tokens), flush=True)  # only after the flush returned
            await writer.stop()
        await log.close()

    db, round_, mode, limit, seconds, burst = sys.argv[1:]
    asyncio.run(main(db, int(round_), mode, int(limit), float(seconds), int(burst)))
    """
)


@dataclass
class Round:
    """What one child acknowledged before it was killed."""

    acks: list[tuple[int | None, str]] = field(default_factory=list)  # (seq or None for the writer, token)
    stderr: str = ""


def _kill_after(script: Path, db: Path, round_: int, mode: str, *, acks: int, delay: float) -> Round:
    """Run the child until it has acknowledged `acks` appends (or HANG_S pass: a hang guard; a loaded machine took
    over 10 s to start the child), wait `delay`, then SIGKILL it."""
    proc = subprocess.Popen(
        [sys.executable, str(script), str(db), str(round_), mode, "1000000", "60", str(BURST)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    buf = b""
    seen = 0
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + HANG_S
    try:
        while seen < acks and time.monotonic() < deadline and proc.poll() is None:
            if sel.select(timeout=0.1):
                chunk = os.read(proc.stdout.fileno(), 65536)
                buf += chunk
                seen = buf.count(b"\nack ") + buf.startswith(b"ack ")
        time.sleep(delay)
        alive = proc.poll() is None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        sel.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    # Lines the child printed before it died are acknowledgements too; a partial last line is not.
    buf += proc.stdout.read()
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stdout.close()
    proc.stderr.close()
    assert alive and proc.returncode == -signal.SIGKILL, f"the child ended on its own:\n{stderr}"
    rnd = Round(stderr=stderr)
    for line in buf.split(b"\n")[:-1]:
        words = line.decode().split()
        if words[:1] != ["ack"]:
            continue
        if mode == "durable":
            rnd.acks.append((int(words[1]), words[2]))
        else:
            rnd.acks.extend((None, token) for token in words[1:])
    assert rnd.acks, f"the child acknowledged nothing in {HANG_S:.0f} s:\n{stderr}"
    return rnd


async def _reopened(db: Path) -> list[tuple[int, _Probed]]:
    """Every row of the log after the crash, decoded (a torn record would fail to decode), in seq order."""
    log = await SqliteEventLog.open(db)
    try:
        async with log.reader() as conn:
            check = (await conn.exec_driver_sql("PRAGMA integrity_check")).all()
        assert [tuple(r) for r in check] == [("ok",)]
        out = []
        async for rec in log.read():
            assert isinstance(rec.event, _Probed)
            out.append((rec.seq, rec.event))
        return out
    finally:
        await log.close()


def _check(db: Path, rounds: list[Round], *, mode: str) -> None:
    rows = asyncio.run(_reopened(db))
    assert [seq for seq, _ in rows] == list(range(1, len(rows) + 1)), "the log has a gap"
    by_token = {ev.token: (seq, ev) for seq, ev in rows}
    assert len(by_token) == len(rows), "an event was committed twice"
    for round_, rnd in enumerate(rounds):
        in_round = [ev for _, ev in rows if ev.round == round_]
        # What a round committed is a prefix of what it appended, in order...
        assert [ev.n for ev in in_round] == list(range(len(in_round)))
        # ...every acknowledged event is in it, with the acknowledged seq and payload...
        for seq, token in rnd.acks:
            assert token in by_token, f"round {round_}: acknowledged {token} lost\n{rnd.stderr}"
            if seq is not None:
                assert by_token[token][0] == seq
        # ...and past the acknowledged, at most what was in flight when the kill came.
        in_flight = 1 if mode == "durable" else BURST
        assert len(rnd.acks) <= len(in_round) <= len(rnd.acks) + in_flight


# Kill points: after a few acks or many, at once or a few milliseconds later, so the SIGKILL lands at
# different places in the append path (encoding, inside the transaction, during the fsync, printing).
MOMENTS = [(200, 0.0), (37, 0.003), (411, 0.011)]


@pytest.mark.parametrize("mode", ["durable", "group_commit"])
def test_sigkill_mid_append_loses_no_acknowledged_event_and_leaves_no_gap(tmp_path: Path, mode: str) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    db = tmp_path / "home" / "blazar.db"
    rounds: list[Round] = []
    for round_, (acks, delay) in enumerate(MOMENTS):
        rounds.append(_kill_after(script, db, round_, mode, acks=acks, delay=delay))
        _check(db, rounds, mode=mode)  # after every crash, and across all of them so far
