"""The smoke gate: before an engine becomes active, start it on the tiny model, ask for a few tokens, stop it.

A binary built for instructions this CPU lacks dies of SIGILL here instead of under a user's first request. Every
engine fault (a crash, a timeout, a bad answer) is a failed SmokeResult with the facts, never an exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping
from pathlib import Path

import httpx2
from pydantic import BaseModel, ConfigDict, Field

from blazar.adapters.engines.client import engine_headers
from blazar.adapters.engines.llama_server import Capabilities, engine_key
from blazar.adapters.engines.process import (
    LoadTimeout,
    ProcessExited,
    describe_exit,
    free_port,
    log_tail,
    spawn,
    stop_process,
    wait_healthy,
)
from blazar.adapters.engines.tiny_model import write_tiny_model
from blazar.errors import EngineError

HOST = "127.0.0.1"
CTX_TOKENS = 256
THREADS = 2
N_PREDICT = 8
STOP_GRACE_S = 5.0
# After a failed request, how long to wait for the engine's exit to show (a crash mid-decode resets the connection
# a moment before the kernel reports the exit).
EXIT_SETTLE_S = 1.0
LOG_TAIL_LINES = 20
DETAIL_LOG_CHARS = 200  # the detail is one line for tables; the whole tail travels beside it


class SmokeResult(BaseModel):
    """What the gate saw: the fields of `engine.smoke_tested`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    passed: bool
    duration_ms: int
    tokens: int = 0  # tokens the engine generated
    detail: str = ""  # one line: what passed, or why not
    log_tail: list[str] = Field(default_factory=list)
    exit_code: int | None = None  # set when the engine exited on its own (-4: SIGILL); None when we stopped it


def smoke_argv(binary: Path, caps: Capabilities, model: Path, port: int) -> list[str]:
    """A short argv from flags the binary lists: model, loopback, port are required (EngineError names the missing
    one); a small context, one slot and two threads keep it light where the flags exist."""
    argv = [str(binary)]
    for names, value in ((("-m", "--model"), str(model)), (("--host",), HOST), (("--port",), str(port))):
        spec = caps.spec(*names)
        if spec is None:
            raise EngineError(f"this llama-server lists no {names[-1]} flag in --help")
        argv += [names[0] if names[0] in spec.names else spec.names[0], value]
    light = ((("-c", "--ctx-size"), CTX_TOKENS), (("-np", "--parallel"), 1), (("-t", "--threads"), THREADS))
    for names, amount in light:
        spec = caps.spec(*names)
        if spec is not None:
            argv += [names[0] if names[0] in spec.names else spec.names[0], str(amount)]
    return argv


async def _complete(port: int, *, ignore_eos: bool, timeout_s: float, api_key: str | None = None) -> int:
    """POST /completion; the number of tokens generated, or EngineError saying what was wrong with the answer."""
    body: dict[str, object] = {"prompt": "hello", "n_predict": N_PREDICT, "temperature": 0.0, "seed": 1}
    if ignore_eos:
        body["ignore_eos"] = True
    async with httpx2.AsyncClient(trust_env=False) as client:
        resp = await client.post(f"http://{HOST}:{port}/completion", content=json.dumps(body),
                                 headers=engine_headers(api_key), timeout=timeout_s)
    if resp.status_code != 200:
        raise EngineError(f"POST /completion answered {resp.status_code}: {resp.text[:200]!r}")
    try:
        data = resp.json()
    except ValueError as e:
        raise EngineError(f"POST /completion answered non-JSON: {resp.text[:200]!r}") from e
    tokens = data.get("tokens_predicted") if isinstance(data, dict) else None
    if tokens is None and isinstance(data, dict):  # older builds report it only under timings
        tokens = (data.get("timings") or {}).get("predicted_n")
    if not isinstance(tokens, int):
        raise EngineError(f"POST /completion answered without a token count: {resp.text[:200]!r}")
    return tokens


async def smoke_test(binary: Path, caps: Capabilities, *, workdir: Path, env: Mapping[str, str],
                     timeout_s: float = 60.0) -> SmokeResult:
    """Start `binary` on the tiny model in `workdir` (its log is `workdir/smoke.log`; `env` the child's whole
    environment, as `spawn` takes it), wait healthy, ask for
    N_PREDICT tokens, stop it. `timeout_s` bounds the load and the request together. The child gets its own key,
    as a served one does (`workdir/smoke.key`, removed at the end)."""
    try:
        model = await asyncio.to_thread(write_tiny_model, workdir / "tiny.gguf")  # creates workdir
    except OSError as e:  # a full disk: a failed test, not a crash of whoever asked (`/ready`, `doctor`)
        return SmokeResult(passed=False, duration_ms=0, detail=f"cannot write the tiny model in {workdir}: "
                           f"{e.strerror or e}")
    log_path = workdir / "smoke.log"
    keyfile = workdir / "smoke.key"
    await asyncio.to_thread(log_path.unlink, missing_ok=True)  # this run's log only
    start = time.monotonic()
    deadline = start + timeout_s
    proc: asyncio.subprocess.Process | None = None
    tokens = 0
    exit_code: int | None = None
    passed = False

    def result(detail: str) -> SmokeResult:
        tail = log_tail(log_path, LOG_TAIL_LINES)
        if not passed and tail:
            detail = f"{detail}; last log line: {tail[-1][:DETAIL_LOG_CHARS]}"
        return SmokeResult(passed=passed, duration_ms=round((time.monotonic() - start) * 1000), tokens=tokens,
                           detail=detail, log_tail=tail, exit_code=exit_code)

    try:
        port = free_port(HOST)
        api_key, key_flags = await asyncio.to_thread(engine_key, caps, keyfile)
        argv = smoke_argv(binary, caps, model, port) + key_flags
        proc = await spawn(argv, log_path=log_path, env=env)
        load_s = await wait_healthy(proc, port, timeout_s=timeout_s, host=HOST)
        try:
            tokens = await _complete(port, ignore_eos=caps.has("--ignore-eos"), api_key=api_key,
                                     timeout_s=max(1.0, deadline - time.monotonic()))
        except (httpx2.HTTPError, EngineError) as e:
            # A crash mid-request shows first as a dropped connection: report the exit, not the symptom.
            try:
                exit_code = await asyncio.wait_for(proc.wait(), timeout=EXIT_SETTLE_S)
            except TimeoutError:
                return result(f"/completion failed: {str(e) or type(e).__name__}")
            return result(f"the engine {describe_exit(exit_code)} during /completion")
        if tokens <= 0:
            return result("the engine answered /completion but generated no tokens")
        passed = True
        return result(f"loaded in {load_s * 1000:.0f} ms and generated {tokens} tokens")
    except ProcessExited as e:
        exit_code = e.returncode
        return result(str(e))
    except LoadTimeout as e:
        return result(str(e))
    except EngineError as e:
        return result(e.message)
    except OSError as e:  # the key file or the log could not be written (a full disk)
        return result(f"cannot prepare the smoke test in {workdir}: {e.strerror or e}")
    finally:
        keyfile.unlink(missing_ok=True)  # the child is stopped below, or never started
        if proc is not None and proc.returncode is None:
            try:
                await stop_process(proc, grace_s=STOP_GRACE_S)
            except EngineError:
                pass  # stuck in the kernel after SIGKILL: nothing more we can do, and the result stands
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()  # cancelled while stopping: do not leave the child behind
                raise
