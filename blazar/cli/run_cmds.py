"""`blazar run MODEL [PROMPT]`: chat with a model through the daemon's OpenAI route (starting the daemon when none
runs), printing the reply as it streams. One shot with a prompt (or a piped stdin), else an interactive loop.

A base model (completion only: blazar/store/chat_templates.py decides, the daemon's /api/show says) continues the
prompt as text through /v1/completions instead, and one line on stderr says so: asked a question as a chat turn, a
model never tuned to answer one mostly repeats it."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import httpx2
import orjson
import typer

from blazar.bootstrap import paths_from_env
from blazar.cli.common import err, print_json
from blazar.cli.daemon_client import (
    HEALTH_TIMEOUT_S,
    AdminClient,
    DaemonUnavailable,
    RemoteError,
    auth_headers,
    daemon_or_start,
    verify_of,
)
from blazar.daemon_file import DaemonInfo

PROMPT = ">>> "
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
BYE = "/bye"
# A reply may wait for a load and then stream for minutes: no read deadline; Ctrl-C ends the wait.
TIMEOUT = httpx2.Timeout(None, connect=HEALTH_TIMEOUT_S)
_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}


@dataclass
class Reply:
    """One streamed answer: its text, and what the client saw of its timing."""

    content: str = ""
    started: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    last_token: float | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None

    def stats(self) -> str:
        parts = []
        if self.first_token is not None:
            parts.append(f"ttft {(self.first_token - self.started) * 1000:.0f} ms")
        tokens = self.usage.get("completion_tokens")
        if isinstance(tokens, int):
            parts.append(f"{tokens} tokens")
            if self.first_token is not None and self.last_token is not None and tokens > 1 \
                    and self.last_token > self.first_token:
                # The first token's time is TTFT; the decode rate counts the tokens after it.
                parts.append(f"{(tokens - 1) / (self.last_token - self.first_token):.1f} tokens/s")
        if isinstance(self.usage.get("prompt_tokens"), int):
            parts.append(f"prompt {self.usage['prompt_tokens']} tokens")
        parts.append(f"total {time.perf_counter() - self.started:.2f} s")
        return ", ".join(parts)


class ChatClient:
    """POST /v1/chat/completions on one daemon, streamed (SSE) or whole."""

    def __init__(self, info: DaemonInfo) -> None:
        self.info, self.url = info, info.url
        # trust_env=False: a proxy from the environment must never sit between the CLI and a loopback daemon.
        # The CLI's admin credential (run/admin.token): `blazar run` keeps working once keys are on.
        self._http = httpx2.Client(base_url=info.url, trust_env=False, timeout=TIMEOUT, headers=auth_headers(),
                                   verify=verify_of(info))

    def close(self) -> None:
        self._http.close()

    def completion_only(self, model: str) -> bool:
        """Whether the daemon serves `model` as a base model (False when it cannot say: the chat route decides)."""
        try:
            r = self._http.post("/api/show", content=orjson.dumps({"model": model}),
                                headers={"content-type": "application/json"})
        except httpx2.TransportError as e:
            raise DaemonUnavailable(f"the daemon at {self.url} did not answer: {e}") from None
        if not r.is_success:
            return False  # an unknown or remote model: the chat request says what is wrong
        own = r.json().get("blazar")
        return isinstance(own, dict) and own.get("completion_only") is True

    def complete(self, body: dict[str, Any], path: str = CHAT_PATH) -> dict[str, Any]:
        try:
            r = self._http.post(path, content=orjson.dumps({**body, "stream": False}),
                                headers={"content-type": "application/json"})
        except httpx2.TransportError as e:
            raise DaemonUnavailable(f"the daemon at {self.url} did not answer: {e}") from None
        if not r.is_success:
            raise _remote_error(r.status_code, r.content)
        data: dict[str, Any] = r.json()
        return data

    def stream(self, body: dict[str, Any], reply: Reply, path: str = CHAT_PATH) -> Iterator[str]:
        """The content deltas (or, on /v1/completions, the text) as they arrive; `reply` collects the text, the usage
        and the token times."""
        payload = orjson.dumps({**body, "stream": True, "stream_options": {"include_usage": True}})
        try:
            with self._http.stream("POST", path, content=payload,
                                   headers={"content-type": "application/json", "accept": "text/event-stream"}) as r:
                if not r.is_success:
                    raise _remote_error(r.status_code, r.read())
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue  # blank separators, comments (": ping"), event names
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    event = orjson.loads(data)
                    if "error" in event:  # the gateway ends a broken stream with an error event
                        raise _remote_error(r.status_code, orjson.dumps(event))
                    if isinstance(event.get("usage"), dict):
                        reply.usage = event["usage"]
                    for choice in event.get("choices") or ():
                        if choice.get("finish_reason"):
                            reply.finish_reason = choice["finish_reason"]
                        text = (choice.get("delta") or {}).get("content") or choice.get("text")
                        if text:
                            now = time.perf_counter()
                            if reply.first_token is None:
                                reply.first_token = now
                            reply.last_token = now
                            reply.content += text
                            yield text
        except httpx2.TransportError as e:
            raise DaemonUnavailable(f"the daemon at {self.url} stopped answering: {e}") from None
        except orjson.JSONDecodeError as e:
            raise DaemonUnavailable(f"the daemon at {self.url} sent a malformed event: {e}") from None


def _remote_error(status: int, raw: bytes) -> RemoteError:
    """The daemon's OpenAI-shaped error ({"error": {message, code}}) as a RemoteError with its exit code."""
    try:
        e = orjson.loads(raw)["error"]
        return RemoteError(str(e["message"]), code=str(e.get("code") or "error"), status=status)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return RemoteError(f"the daemon answered {status}: {raw[:300].decode(errors='replace')}", code="error",
                           status=status)


def _daemon() -> DaemonInfo:
    return daemon_or_start(paths_from_env())


def _say(client: ChatClient, body: dict[str, Any], reply: Reply, *, verbose: bool, path: str = CHAT_PATH) -> None:
    """Stream one reply to stdout, collected in `reply`. Ctrl-C stops it (closing the connection, so the engine
    stops generating) and propagates, with what came before it in `reply`."""
    try:
        for text in client.stream(body, reply, path):
            sys.stdout.write(text)
            sys.stdout.flush()
    finally:
        if reply.content and not reply.content.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.flush()
    if verbose:
        err.print(reply.stats(), style="dim", **_VERBATIM)


def _lines() -> Iterator[str]:
    """What the user types, line by line, until Ctrl-D or /bye; blank lines skipped, Ctrl-C at the prompt says how
    to leave."""
    while True:
        try:
            line = input(PROMPT)
        except EOFError:
            sys.stdout.write("\n")
            return
        except KeyboardInterrupt:
            sys.stdout.write(f"\n(type {BYE} or press Ctrl-D to leave)\n")
            continue
        text = line.strip()
        if not text:
            continue
        if text == BYE:
            return
        yield line


def _completion_loop(client: ChatClient, base: dict[str, Any], *, verbose: bool) -> None:
    """A base model, interactively: each line is continued on its own (a base model keeps no conversation)."""
    for line in _lines():
        try:
            _say(client, {**base, "prompt": line}, Reply(), verbose=verbose, path=COMPLETIONS_PATH)
        except KeyboardInterrupt:
            sys.stdout.write("(stopped)\n")
        except RemoteError as e:
            err.print(f"error: {e.message}", style="bold red", **_VERBATIM)


def _chat_loop(client: ChatClient, base: dict[str, Any], messages: list[dict[str, Any]], *, verbose: bool) -> None:
    for line in _lines():
        messages.append({"role": "user", "content": line})
        reply = Reply()
        try:
            _say(client, {**base, "messages": messages}, reply, verbose=verbose)
        except KeyboardInterrupt:
            # NOTE: what the model said before Ctrl-C stays in the conversation (the user saw it), and the turns
            # keep alternating, which chat templates require.
            sys.stdout.write("(stopped)\n")
            messages.append({"role": "assistant", "content": reply.content})
            continue
        except RemoteError as e:
            err.print(f"error: {e.message}", style="bold red", **_VERBATIM)
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": reply.content})


def run(
    model: Annotated[str, typer.Argument(help="A model name from `blazar list`.")],
    prompt: Annotated[str | None, typer.Argument(help="Ask this once and exit. Without it: read the prompt from "
                                                 "stdin when piped, else chat interactively (/bye ends).")] = None,
    system: Annotated[str | None, typer.Option("--system", help="A system message to start with.")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", min=1, help="Stop after this many tokens.")] = None,
    temperature: Annotated[float | None, typer.Option("--temperature", min=0.0, help="Sampling temperature "
                                                      "(default: the engine's).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the daemon's whole chat.completion answer as JSON "
                                          "instead of streaming text (needs a prompt).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Timing on stderr after each reply: time to "
                                          "first token, tokens/s (from the usage the engine reports).")] = False,
    chat: Annotated[bool, typer.Option("--chat", help="Send the prompt as a chat turn even to a base model (one "
                                       "whose GGUF has no chat template and is not tuned for instructions), "
                                       "which otherwise continues the prompt as text.")] = False,
) -> None:
    """Chat with a model through the daemon (starting it when none runs); the model loads on first use. A base
    model continues the prompt as text instead (one line on stderr says so; --chat overrides)."""
    if prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
        if not prompt.strip():
            raise typer.BadParameter("stdin was empty: nothing to ask", param_hint="PROMPT")
    if as_json and prompt is None:
        raise typer.BadParameter("--json needs a prompt (an argument or stdin)", param_hint="--json")
    base: dict[str, Any] = {"model": model}
    if max_tokens is not None:
        base["max_tokens"] = max_tokens
    if temperature is not None:
        base["temperature"] = temperature
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    info = _daemon()
    client = ChatClient(info)
    try:
        if not chat and client.completion_only(model):
            err.print(f"{model} is a base model (no chat template, not tuned for instructions): it continues your "
                      "text rather than answering it (--chat sends a chat turn anyway)", style="dim", soft_wrap=True,
                      **_VERBATIM)
            _complete(client, model, base, prompt, system, as_json=as_json, verbose=verbose)
            return
        if prompt is not None:
            body = {**base, "messages": [*messages, {"role": "user", "content": prompt}]}
            if as_json:
                print_json(client.complete(body))
                return
            try:
                _say(client, body, Reply(), verbose=verbose)
            except KeyboardInterrupt:
                raise typer.Exit(130) from None
            return
        # Interactive: load first, so a wrong name or a model that cannot load is said before the first prompt.
        with AdminClient(info) as admin:
            err.print(f"loading {model} ...", style="dim", **_VERBATIM)
            admin.load(model)
        err.print(f"{model} is ready; {BYE} or Ctrl-D ends, Ctrl-C stops a reply", style="dim", **_VERBATIM)
        _chat_loop(client, base, messages, verbose=verbose)
    finally:
        client.close()


def _complete(client: ChatClient, model: str, base: dict[str, Any], prompt: str | None, system: str | None, *,
              as_json: bool, verbose: bool) -> None:
    """`blazar run` on a base model: the prompt (after --system's text, if any) continued as text."""
    if prompt is None:
        with AdminClient(client.info) as admin:
            admin.load(model)
        err.print(f"{model} is ready; each line is continued on its own; {BYE} or Ctrl-D ends", style="dim",
                  **_VERBATIM)
        _completion_loop(client, base, verbose=verbose)
        return
    body = {**base, "prompt": f"{system}\n\n{prompt}" if system else prompt}
    if as_json:
        print_json(client.complete(body, COMPLETIONS_PATH))
        return
    sys.stdout.write(prompt)  # the continuation reads on from the prompt, as text does
    sys.stdout.flush()
    try:
        _say(client, body, Reply(), verbose=verbose, path=COMPLETIONS_PATH)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
