"""The chat templates Blazar ships, for a GGUF that carries none: each a turn format (the markers that open and close
a speaker's turn) from which its Jinja text is built, so every one renders the same things the same way: the system
text, the tool definitions, an assistant's tool calls and the tools' results.

Tools where the model's own format has no tool syntax (all of these): the tools go at the end of the system turn
(Gemma, which has no system role: at the start of the first user turn) as one JSON object per line between `<tools>`
and `</tools>`, after one instruction; an assistant's call is written `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`, one line per call, and a tool's result comes back in a turn of its own between `<tool_response>`
and `</tool_response>` (docs/4.MODELS.md shows one). llama-server reads the calls back out of an answer in that form
(its parser is derived from the template).

Each format also names its stop strings: its end-of-turn marker and the markers that open the next speaker's turn. A
base model that runs on past its answer is stopped there by the gateway (blazar/serving/model_defaults.py), so an
answer ends where the next speaker would begin.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import jinja2.sandbox

TOOLS_INSTRUCTION = ("You can call the functions listed between <tools> and </tools>. To call one, write a line "
                     "<tool_call>{\"name\": \"<its name>\", \"arguments\": <its arguments as a JSON object>}"
                     "</tool_call> and nothing after it.")


@dataclass(frozen=True, slots=True)
class TurnFormat:
    """One template Blazar knows: a speaker's turn is `open + text + close`; the prompt ends with `reply`, where the
    model's answer begins."""

    name: str
    user: tuple[str, str]
    model: tuple[str, str]
    reply: str
    system: tuple[str, str] | None  # None: no system role (the system text opens the first user turn)
    tool: tuple[str, str]  # a tool's result, its own turn
    stops: tuple[str, ...]  # the end-of-turn marker and the next turns' openers

    @property
    def jinja(self) -> str:
        return _jinja(self)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
               add_generation_prompt: bool = True) -> str:
        """The prompt this template gives (what the engine renders from the same text; the probe's prompts and the
        tests render with it)."""
        return _compiled(self.jinja).render(messages=messages, tools=tools or None,
                                            add_generation_prompt=add_generation_prompt)


GEMMA = TurnFormat(
    name="gemma", user=("<start_of_turn>user\n", "<end_of_turn>\n"),
    model=("<start_of_turn>model\n", "<end_of_turn>\n"), reply="<start_of_turn>model\n", system=None,
    tool=("<start_of_turn>user\n<tool_response>\n", "\n</tool_response><end_of_turn>\n"),
    stops=("<end_of_turn>", "<start_of_turn>"))
CHATML = TurnFormat(
    name="chatml", user=("<|im_start|>user\n", "<|im_end|>\n"), model=("<|im_start|>assistant\n", "<|im_end|>\n"),
    reply="<|im_start|>assistant\n", system=("<|im_start|>system\n", "<|im_end|>\n"),
    tool=("<|im_start|>user\n<tool_response>\n", "\n</tool_response><|im_end|>\n"),
    stops=("<|im_end|>", "<|im_start|>"))
# A plain transcript, as text on the web reads: what a base model continues most readily. No trailing space after
# "Assistant:": the model writes its own (a prompt ending in a space throws a base model off).
TRANSCRIPT = TurnFormat(
    name="transcript", user=("User: ", "\n"), model=("Assistant: ", "\n"), reply="Assistant:",
    system=("System: ", "\n"), tool=("Tool: <tool_response>\n", "\n</tool_response>\n"),
    stops=("\nUser:", "\nAssistant:", "\nSystem:", "\nTool:"))

KNOWN: dict[str, TurnFormat] = {f.name: f for f in (GEMMA, CHATML, TRANSCRIPT)}


def by_text(template: str | None) -> TurnFormat | None:
    """The known format whose Jinja text `template` is (a template set by name is stored as its text)."""
    return next((f for f in KNOWN.values() if f.jinja == template), None) if template else None


def _lit(text: str) -> str:
    """A Jinja string literal of `text`."""
    return json.dumps(text)


@functools.cache
def _jinja(f: TurnFormat) -> str:
    # The text of a message: a string, or the text parts of a list; None (an assistant's turn of tool calls) is "".
    text = ("{%- macro text(c) -%}{%- if c is string -%}{{ c | trim }}{%- elif c is iterable and c is not mapping -%}"
            "{%- set ns = namespace(t='') -%}{%- for p in c -%}{%- if p['type'] == 'text' -%}"
            "{%- set ns.t = ns.t + p['text'] -%}{%- endif -%}{%- endfor -%}{{ ns.t | trim }}"
            "{%- endif -%}{%- endmacro -%}")
    tools = ("{%- macro tool_list() -%}{{ " + _lit(TOOLS_INSTRUCTION + "\n<tools>\n") + " }}"
             "{%- for t in tools -%}{{ (t['function'] if t['function'] is defined else t) | tojson }}{{ '\\n' }}"
             "{%- endfor -%}{{ '</tools>' }}{%- endmacro -%}")
    calls = ("{%- macro tool_calls(m) -%}{%- for c in m['tool_calls'] -%}"
             "{%- if not loop.first or text(m['content']) -%}{{ '\\n' }}{%- endif -%}"
             "{%- set a = c['function']['arguments'] -%}"
             "{{ '<tool_call>{\"name\": ' }}{{ c['function']['name'] | tojson }}{{ ', \"arguments\": ' }}"
             "{%- if a is string -%}{{ a }}{%- else -%}{{ a | tojson }}{%- endif -%}{{ '}</tool_call>' }}"
             "{%- endfor -%}{%- endmacro -%}")
    head = ("{%- if messages and messages[0]['role'] in ['system', 'developer'] -%}"
            "{%- set system = text(messages[0]['content']) -%}{%- set turns = messages[1:] -%}"
            "{%- else -%}{%- set system = '' -%}{%- set turns = messages -%}{%- endif -%}"
            "{%- if tools -%}{%- set system = (system + '\\n\\n' if system else '') + tool_list() -%}{%- endif -%}")
    if f.system is not None:
        opening = "{%- if system -%}{{ " + _lit(f.system[0]) + " + system + " + _lit(f.system[1]) + " }}{%- endif -%}"
        first_user = ""
    else:  # the system text (and tools) open the first user turn
        opening = ""
        first_user = "{%- if loop.first and system -%}{{ system + '\\n\\n' }}{%- endif -%}"
    turns = ("{%- for m in turns -%}"
             "{%- if m['role'] == 'assistant' -%}{{ " + _lit(f.model[0]) + " }}{{ text(m['content']) }}"
             "{%- if m['tool_calls'] is defined and m['tool_calls'] -%}{{ tool_calls(m) }}{%- endif -%}"
             "{{ " + _lit(f.model[1]) + " }}"
             "{%- elif m['role'] == 'tool' -%}{{ " + _lit(f.tool[0]) + " }}{{ text(m['content']) }}{{ "
             + _lit(f.tool[1]) + " }}"
             "{%- else -%}{{ " + _lit(f.user[0]) + " }}" + first_user + "{{ text(m['content']) }}{{ "
             + _lit(f.user[1]) + " }}"
             "{%- endif -%}{%- endfor -%}"
             "{%- if add_generation_prompt -%}{{ " + _lit(f.reply) + " }}{%- endif -%}")
    return text + tools + calls + head + opening + turns


_ENV = jinja2.sandbox.ImmutableSandboxedEnvironment(undefined=jinja2.ChainableUndefined)
# As llama-server's `tojson` writes: keys in their order, ", " and ": ", no HTML escapes (Jinja's own sorts the keys
# and escapes <, >, & and ').
_ENV.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
_CACHE: dict[str, jinja2.Template] = {}


def render_jinja(text: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
                 add_generation_prompt: bool = True) -> str:
    """The prompt a Jinja chat template gives for `messages`, rendered as the engine renders it (sandboxed): for
    templates Blazar writes itself, such as one converted from Ollama's (blazar/dialects/go_template.py)."""
    return _compiled(text).render(messages=messages, tools=tools or None, add_generation_prompt=add_generation_prompt)


def _compiled(text: str) -> jinja2.Template:
    got = _CACHE.get(text)
    if got is None:
        got = _CACHE[text] = _ENV.from_string(text)
    return got
