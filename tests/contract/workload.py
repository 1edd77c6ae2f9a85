"""What the contract suite writes: real events tagged by writer and index, and a writer in a child process.

Run as `python -m tests.contract.workload BACKEND LOCATION MODE TAG COUNT [--wait] [--die]`. The child opens the
log, prints `ready`, waits for a line on stdin when `--wait` is given (so several children start appending at the
same moment), appends COUNT events as actor `contract:TAG`, prints one JSON line and exits. MODE `append` uses
the durable `log.append` one event at a time and reports the seqs it got; `group` submits through the
group-commit writer. `--die` ends the process with `os._exit` right after the last append: no close, no flush.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import orjson

from blazar.events.base import Event
from blazar.events.models import ModelAliased
from blazar.events.requests import RequestReceived
from blazar.events.writer import GroupCommitWriter
from tests.contract.backends import Backend, open_log

REPO = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_S = 30.0
PACE_S = 0.001


def actor(tag: str) -> str:
    return f"contract:{tag}"


def aliased(tag: str, i: int) -> ModelAliased:
    """A control event (durable path): stream `model:<tag>`, audit-relevant."""
    return ModelAliased(alias=f"{tag}-{i:04d}", target=tag)


def received(tag: str, i: int) -> RequestReceived:
    """A request event (group-commit path): stream `trace:<tag>-<i>`, `body_bytes` carries the index."""
    return RequestReceived(trace_id=f"{tag}-{i:04d}", dialect="openai", route="/v1/chat/completions", model=tag,
                           body_bytes=i)


def index_of(event: Event) -> int:
    """The writer's own index of an event written by `aliased` or `received`."""
    if isinstance(event, ModelAliased):
        return int(event.alias.rsplit("-", 1)[1])
    assert isinstance(event, RequestReceived), event
    return event.body_bytes


# -- the child ---------------------------------------------------------------------------------------------


async def _child(args: argparse.Namespace) -> None:
    log = await open_log(args.location)
    print("ready", flush=True)
    if args.wait:
        await asyncio.to_thread(sys.stdin.readline)
    seqs: list[int] = []
    if args.mode == "append":
        for i in range(args.count):
            (rec,) = await log.append(aliased(args.tag, i), actor=actor(args.tag))
            seqs.append(rec.seq)
            # NOTE: a pause between transactions lets the other writer, asleep in its busy handler, take the
            # lock; without it one process tends to hold the log for most of its run and the writers barely mix.
            await asyncio.sleep(PACE_S)
    else:
        writer = GroupCommitWriter(log, interval=0.002, max_batch=32)
        writer.start()
        for i in range(args.count):
            ev = received(args.tag, i)
            writer.submit(ev, actor=actor(args.tag), trace_id=ev.trace_id)
            if i % 4 == 3:
                await asyncio.sleep(PACE_S)  # several small batches, committed while the other writer appends
        await writer.stop()
    print(orjson.dumps({"seqs": seqs}).decode(), flush=True)
    if args.die:
        os._exit(0)
    await log.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("backend")
    parser.add_argument("location")
    parser.add_argument("mode", choices=["append", "group"])
    parser.add_argument("tag")
    parser.add_argument("count", type=int)
    parser.add_argument("--wait", action="store_true")
    parser.add_argument("--die", action="store_true")
    asyncio.run(_child(parser.parse_args(argv)))


# -- the parent's side -------------------------------------------------------------------------------------


@dataclass
class Child:
    proc: asyncio.subprocess.Process
    tag: str

    async def ready(self) -> None:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), CHILD_TIMEOUT_S)
        assert line == b"ready\n", f"writer {self.tag} did not start: {line!r}"

    async def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        await self.proc.stdin.drain()

    async def result(self) -> list[int]:
        """Wait for the child to finish (bounded); the seqs it was given (empty for `group`)."""
        try:
            out, err = await asyncio.wait_for(self.proc.communicate(), CHILD_TIMEOUT_S)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError(f"writer {self.tag} ran past {CHILD_TIMEOUT_S}s") from None
        assert self.proc.returncode == 0, f"writer {self.tag} exited {self.proc.returncode}: {err.decode()}"
        return orjson.loads(out.splitlines()[-1])["seqs"]

    async def kill(self) -> None:
        """End the child if it is still running (a test that failed before `result()`)."""
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def spawn(backend: Backend, mode: str, tag: str, count: int, *, wait: bool = False,
                die: bool = False) -> Child:
    """Start a writer process on `backend`'s log; await `ready()` before relying on it having opened the log."""
    argv = [backend.name, backend.location, mode, tag, str(count)]
    argv += ["--wait"] if wait else []
    argv += ["--die"] if die else []
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # In the backend's home, never the checkout: nothing a child makes may land there.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.contract.workload", *argv, cwd=backend.paths.data_dir, env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    return Child(proc, tag)


if __name__ == "__main__":
    main()
