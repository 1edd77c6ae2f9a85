"""Model settings commands: set a model's chat template, system prompt and default parameters (`blazar model set`),
and make a variant, a new name for a stored model's bytes with settings of its own (Ollama's `/api/create`).

Validation lives here, once, for the CLI, the API and the registry: a template is a llama.cpp built-in name or a
Jinja text (a Go template, Ollama's own kind, is refused with what is accepted), a parameter is one llama-server
samples by, under its Ollama name, with a value of the right type.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson

from blazar.context import Blazar
from blazar.dialects.ollama import map_options
from blazar.errors import (
    DialectError,
    EngineError,
    EngineIncompatible,
    InvalidModelSettings,
    ModelExists,
    ModelNotFound,
)
from blazar.events.base import Recorded
from blazar.events.bounds import PARAMETERS_BYTES, SYSTEM_BYTES, TEMPLATE_BYTES
from blazar.events.model_settings import (
    MAX_REASONING_BUDGET,
    ModelConfigured,
    ModelSettings,
    ModelVariantCreated,
    ParameterValue,
)
from blazar.events.models import ModelMetadata
from blazar.events.requests import REASONING_EFFORTS, effort_of
from blazar.projections.catalog import alias_target, ever_configured, is_model, stored
from blazar.store.models import check_name
from blazar.store.turn_formats import KNOWN

if TYPE_CHECKING:
    from blazar.adapters.engines.llama_server import Capabilities

TemplateKind = Literal["builtin", "jinja"]

# llama.cpp's built-in templates (`--chat-template NAME`), as this project's engine lists them in `--help`; the active
# engine's own list is preferred where one is installed.
BUILTIN_TEMPLATES = (
    "bailing", "bailing-think", "bailing2", "chatglm3", "chatglm4", "chatml", "command-r", "deepseek", "deepseek-ocr",
    "deepseek2", "deepseek3", "exaone-moe", "exaone3", "exaone4", "falcon3", "gemma", "gigachat", "glmedge", "gpt-oss",
    "granite", "granite-4.0", "granite-4.1", "grok-2", "hunyuan-dense", "hunyuan-moe", "hunyuan-vl", "kimi-k2",
    "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "llama3", "llama4", "megrez", "minicpm",
    "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "monarch", "openchat",
    "orion", "pangu-embedded", "phi3", "phi4", "rwkv-world", "seed_oss", "smolvlm", "solar-open", "vicuna",
    "vicuna-orca", "yandex", "zephyr",
)
MAX_STOPS = 16
MAX_DEFAULT_LORAS = 8  # the LoRA adapters a model's settings may apply by default

# Default parameters, by Ollama's name: what llama-server samples by. Other spellings users bring from llama-server
# or OpenAI are accepted and stored under Ollama's name.
_FLOATS = frozenset({"temperature", "top_p", "min_p", "typical_p", "repeat_penalty", "presence_penalty",
                     "frequency_penalty", "mirostat_tau", "mirostat_eta"})
_INTS = frozenset({"top_k", "seed", "repeat_last_n", "mirostat", "num_keep", "num_predict", "num_ctx"})
PARAMETERS = tuple(sorted(_FLOATS | _INTS | {"stop"}))
_SPELLINGS = {"ctx": "num_ctx", "ctx_size": "num_ctx", "max_tokens": "num_predict", "n_predict": "num_predict",
              "n_keep": "num_keep"}
# Ollama's load-time options: Blazar's fit planner decides these per machine, so a model cannot carry them.
_PLANNED = frozenset({"num_batch", "num_gpu", "main_gpu", "num_thread", "use_mmap", "use_mlock", "low_vram", "f16_kv",
                      "numa", "num_gqa"})
# A Go template action: `{{ .Prompt }}`, `{{- if .System }}`, `{{ range .Messages }}`, `{{ end }}`, `{{ $x := ... }}`.
_GO_ACTION = re.compile(r"\{\{-?\s*(?:\.|\$|(?:if|range|with|else|end|template|block|define)\b)")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


# -- validation ----------------------------------------------------------------------------------------------------


def engine_templates(help_text: str) -> tuple[str, ...]:
    """The built-in template names an engine's `--chat-template` help lists; () when it lists none."""
    _, sep, rest = help_text.partition("list of built-in templates:")
    if not sep:
        return ()
    return tuple(n for n in (p.strip() for p in rest.split(",")) if _NAME.fullmatch(n))


# `--template blazar:transcript`: a template Blazar ships (blazar/store/turn_formats.py), by name.
SHIPPED_PREFIX = "blazar:"


def parse_template(text: str, known: Iterable[str] = BUILTIN_TEMPLATES) -> tuple[TemplateKind, str]:
    """A template as given -> (kind, text): a built-in name, one Blazar ships (`blazar:NAME`: its Jinja text), or a
    Jinja text. A Go template is refused."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidModelSettings("template: empty; give a llama.cpp built-in template name (gemma, chatml, llama3, "
                                   "...) or a Jinja chat template")
    _within("template", text, TEMPLATE_BYTES)
    if _GO_ACTION.search(text):
        raise InvalidModelSettings(
            "template: this is a Go template ({{ .Prompt }} style), which Ollama's own runner reads but llama-server "
            "does not; give a llama.cpp built-in template name (gemma, chatml, llama3, ...) or a Jinja chat template "
            "(as in a Hugging Face tokenizer_config.json: {% for message in messages %}...)")
    if text.strip().startswith(SHIPPED_PREFIX):  # one Blazar ships (they carry tools): its Jinja text
        name = text.strip()[len(SHIPPED_PREFIX):]
        if name not in KNOWN:
            raise InvalidModelSettings(f"template: Blazar ships no template {name[:64]!r} (it ships "
                                       f"{', '.join(SHIPPED_PREFIX + n for n in KNOWN)})")
        return "jinja", KNOWN[name].jinja
    if "{{" in text or "{%" in text:
        if text.count("{%") != text.count("%}") or text.count("{{") != text.count("}}"):
            raise InvalidModelSettings("template: unbalanced Jinja delimiters ({% %} or {{ }})")
        return "jinja", text
    name = text.strip()
    names = tuple(known)
    if name not in names:
        raise InvalidModelSettings(f"template: {name[:64]!r} is neither a Jinja template nor a built-in template "
                                   f"name this engine knows ({', '.join(names)})")
    return "builtin", name


def parse_parameter(key: str, value: Any) -> tuple[str, ParameterValue]:
    """One default parameter -> (its Ollama name, a typed value). `value` is text (the CLI, a Modelfile) or JSON."""
    name = _SPELLINGS.get(key, key)
    if name in _PLANNED:
        raise InvalidModelSettings(f"parameter {key}: not supported; Blazar's memory planner chooses batch, offload "
                                   "and threads per machine (blazar fit shows its plan)")
    if name not in PARAMETERS:
        raise InvalidModelSettings(f"parameter {key!r}: unknown; accepted: {', '.join(PARAMETERS)}")
    if name == "stop":
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or not stops or not all(isinstance(s, str) and s for s in stops):
            raise InvalidModelSettings(f"parameter stop: expected a non-empty string or a list of them, got {value!r}")
        return name, [_unquoted(s) for s in stops]
    typed: int | float
    if isinstance(value, str):
        text = _unquoted(value.strip())
        try:
            typed = int(text) if name in _INTS else float(text)
        except ValueError:
            kind = "an integer" if name in _INTS else "a number"
            raise InvalidModelSettings(f"parameter {key}: expected {kind}, got {value!r}") from None
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidModelSettings(f"parameter {key}: expected a number, got {value!r}")
    elif name in _INTS and isinstance(value, float):
        if not value.is_integer():
            raise InvalidModelSettings(f"parameter {key}: expected an integer, got {value!r}")
        typed = int(value)
    else:
        typed = value
    if name in _FLOATS:
        try:
            typed = float(typed)
        except OverflowError:
            typed = math.inf
        if not math.isfinite(typed):
            raise InvalidModelSettings(f"parameter {key}: expected a finite number, got {value!r}")
    try:  # the same ranges a request's own options are held to
        map_options({name: typed})
    except DialectError as e:
        raise InvalidModelSettings(f"parameter {e.message.removeprefix('options.')}") from None
    return name, typed


def parse_parameters(pairs: Iterable[tuple[str, Any]]) -> dict[str, ParameterValue]:
    """Parameters in order; repeated `stop`s add up (as in a Modelfile), any other repeat keeps the last."""
    out: dict[str, ParameterValue] = {}
    for key, value in pairs:
        name, typed = parse_parameter(key, value)
        if name == "stop" and isinstance(typed, list):
            prior = out.get("stop")
            typed = [*(prior if isinstance(prior, list) else []), *typed]
            if len(typed) > MAX_STOPS:
                raise InvalidModelSettings(f"parameter stop: more than {MAX_STOPS} stop strings")
        out[name] = typed
    _within("parameters", out, PARAMETERS_BYTES)
    return out


def _unquoted(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    return text


def check_system(text: str) -> str:
    if not isinstance(text, str):
        raise InvalidModelSettings("system: expected text")
    _within("system", text, SYSTEM_BYTES)
    return text


def _within(what: str, value: Any, limit: int) -> None:
    """A setting is recorded in `model.configured`, so it is held to that event's bound on it (JSON bytes)."""
    size = len(orjson.dumps(value))
    if size > limit:
        raise InvalidModelSettings(f"{what}: {size:,} bytes as JSON, more than the {limit:,} accepted")


# -- what a change makes of the settings -------------------------------------------------------------------------


CacheSetting = Literal["exact", "semantic", "off"] | None
_CACHE_SETTINGS: dict[str, CacheSetting] = {"exact": "exact", "semantic": "semantic", "off": "off", "none": None}


@dataclass(frozen=True)
class SettingsChange:
    """What one command asks: fields to set (None: leave as is) and fields to clear."""

    template: str | None = None  # a built-in name or a Jinja text, validated by `parse_template`
    system: str | None = None
    parameters: Mapping[str, ParameterValue] = field(default_factory=dict)  # validated (`parse_parameters`)
    clear_template: bool = False
    clear_system: bool = False
    clear_parameters: tuple[str, ...] = ()  # names (any accepted spelling); "all" clears every one
    rerank: bool | None = None  # force rerank mode on (True) or off (False); None: leave as is
    lora: Mapping[str, float] | None = None  # the LoRA adapters applied by default (names); None: leave as is
    reasoning_budget: int | None = None  # thinking tokens (blazar/serving/reasoning.py); None: leave as is
    reasoning_effort: str | None = None
    clear_reasoning: bool = False  # both back to none (before any set by the same change)
    cache: str | None = None  # the response cache: "exact", "semantic", "off", or "none" (no say); None: leave as is

    def applied_to(self, old: ModelSettings | None, known: Iterable[str] = BUILTIN_TEMPLATES
                   ) -> tuple[ModelSettings, list[str]]:
        """The settings after this change, and what it changed."""
        base = old or ModelSettings()
        kind, template = base.template_kind, base.template
        system, params = base.system, dict(base.parameters)
        changed: list[str] = []
        if self.clear_template and template is not None:
            kind, template = None, None
            changed.append("template")
        if self.template is not None:
            kind, template = parse_template(self.template, known)
            changed.append("template")
        if self.clear_system and system is not None:
            system = None
            changed.append("system")
        if self.system is not None:
            system = check_system(self.system)
            changed.append("system")
        for key in self.clear_parameters:
            names = list(params) if key == "all" else [_SPELLINGS.get(key, key)]
            for name in names:
                if name not in PARAMETERS:
                    raise InvalidModelSettings(f"parameter {key!r}: unknown; accepted: {', '.join(PARAMETERS)}")
                if params.pop(name, None) is not None:
                    changed.append(f"parameters.{name}")
        for name, value in self.parameters.items():
            params[name] = value
            changed.append(f"parameters.{name}")
        _within("parameters", params, PARAMETERS_BYTES)
        rerank = base.rerank
        if self.rerank is not None and self.rerank != rerank:
            rerank = self.rerank
            changed.append("rerank")
        lora = dict(base.lora)
        if self.lora is not None and dict(self.lora) != lora:
            if len(self.lora) > MAX_DEFAULT_LORAS:
                raise InvalidModelSettings(f"lora: {len(self.lora)} adapters; a model applies at most "
                                           f"{MAX_DEFAULT_LORAS} by default")
            lora = dict(self.lora)
            changed.append("lora")
        budget, effort = self._reasoning(base, changed)
        new = ModelSettings(template_kind=kind, template=template, system=system, parameters=params, rerank=rerank,
                            lora=lora, reasoning_budget=budget, reasoning_effort=effort_of(effort),
                            cache=self._cache(base.cache, changed))
        return new, list(dict.fromkeys(changed))

    def _reasoning(self, base: ModelSettings, changed: list[str]) -> tuple[int | None, str | None]:
        """The thinking's budget and effort after this change (`changed` told what moved)."""
        budget: int | None = base.reasoning_budget
        effort: str | None = base.reasoning_effort
        if self.clear_reasoning:
            if budget is not None:
                changed.append("reasoning_budget")
            if effort is not None:
                changed.append("reasoning_effort")
            budget, effort = None, None
        if self.reasoning_budget is not None:
            if isinstance(self.reasoning_budget, bool) or not 0 <= self.reasoning_budget <= MAX_REASONING_BUDGET:
                raise InvalidModelSettings(f"reasoning budget: expected 0 to {MAX_REASONING_BUDGET:,} tokens, got "
                                           f"{self.reasoning_budget!r}")
            budget = self.reasoning_budget
            changed.append("reasoning_budget")
        if self.reasoning_effort is not None:
            if self.reasoning_effort not in REASONING_EFFORTS:
                raise InvalidModelSettings(f"reasoning effort: expected one of {', '.join(REASONING_EFFORTS)}, got "
                                           f"{self.reasoning_effort[:40]!r}")
            effort = self.reasoning_effort
            changed.append("reasoning_effort")
        return budget, effort

    def _cache(self, had: CacheSetting, changed: list[str]) -> CacheSetting:
        """The response cache setting after this change ("none": no say of its own)."""
        if self.cache is None:
            return had
        if self.cache not in _CACHE_SETTINGS:
            raise InvalidModelSettings(f"cache: expected exact, semantic, off or none, got {self.cache[:32]!r}")
        wanted = _CACHE_SETTINGS[self.cache]
        if wanted != had:
            changed.append("cache")
        return wanted


def known_templates(app: Blazar) -> tuple[str, ...]:
    """The built-in template names the active engine knows; the packaged list when no engine is installed."""
    from blazar.store.engines import active_engine  # engines imports adapters this module does not need

    try:
        spec = active_engine(app).caps.spec("--chat-template")
    except EngineError:  # NOTE: no engine yet (or a broken one): settings can still be made; the load checks again
        spec = None
    listed = engine_templates(spec.help) if spec is not None else ()
    return listed or BUILTIN_TEMPLATES


# -- commands ----------------------------------------------------------------------------------------------------


async def configure_model(app: Blazar, name: str, change: SettingsChange, *,
                          source: Literal["cli", "api", "registry"] = "cli") -> Recorded:
    """Record `name`'s settings after `change` (`model.configured`). An alias configures the model it names."""
    await app.runner.catch_up()
    entry = stored(app.runner.state("catalog"), name)
    if entry is None:
        raise ModelNotFound(f"no model named {name!r} in the store (see: blazar list)")
    settings, changed = change.applied_to(entry.settings, known_templates(app))
    (rec,) = await app.record(ModelConfigured(name=entry.name, settings=settings, changed=changed, source=source))
    return rec


async def create_variant(app: Blazar, name: str, base: str, change: SettingsChange) -> Recorded:
    """Make `name` a variant of `base`: `base`'s file (not copied), `base`'s settings with `change` on top.

    Creating a variant that exists from the same base replaces its settings (Ollama's create overwrites); `name`
    equal to `base` configures the model itself. A name taken by another model or an alias is refused."""
    check_name(name)
    await app.runner.catch_up()
    catalog = app.runner.state("catalog")
    origin = stored(catalog, base)
    if origin is None:
        raise ModelNotFound(f"FROM {base!r}: no model by that name in the store (blazar list shows them; blazar pull "
                            "or blazar import adds one)")
    known = known_templates(app)
    unknown = [n for n in change.lora or () if n not in {a.name for a in origin.loras}]
    if unknown:  # NOTE: only adapters already in the store under the model: a client's file path is not trusted
        have = ", ".join(a.name for a in origin.loras) or "none"
        raise InvalidModelSettings(f"ADAPTER {unknown[0]!r}: {origin.name} has no LoRA adapter by that name (it has: "
                                   f"{have}); add the file on the server first (blazar lora add {origin.name} FILE "
                                   f"--name NAME), then ADAPTER NAME")
    existing = stored(catalog, name)
    if existing is not None and existing.name == origin.name:
        settings, changed = change.applied_to(origin.settings, known)
        (rec,) = await app.record(ModelConfigured(name=origin.name, settings=settings, changed=changed, source="api"))
        return rec
    if existing is not None and existing.base == origin.name:
        settings, changed = change.applied_to(origin.settings, known)
        (rec,) = await app.record(ModelConfigured(name=existing.name, settings=settings, changed=changed,
                                                  source="api"))
        return rec
    if existing is not None or is_model(catalog, name) or alias_target(catalog, name) is not None:
        raise ModelExists(f"{name!r} is already a model or alias not made from {origin.name!r}; remove it first "
                          f"(blazar rm {name}) or pick another name")
    settings, _ = change.applied_to(origin.settings, known)
    (rec,) = await app.record(ModelVariantCreated(name=name, base=origin.name, settings=settings))
    return rec


async def apply_registry_settings(app: Blazar, name: str, template: str | None, system: str | None,
                                  parameters: Mapping[str, Any]) -> Recorded | None:
    """After a registry pull: give the model the registry's settings, unless it has had settings of its own (a user's
    change, even a cleared one, is never overwritten by pulling again)."""
    if template is None and system is None and not parameters:
        return None
    await app.runner.catch_up()
    if ever_configured(app.runner.state("catalog"), name):
        return None
    change = SettingsChange(template=template, system=system, parameters=parse_parameters(parameters.items()))
    return await configure_model(app, name, change, source="registry")


# -- serving -----------------------------------------------------------------------------------------------------


def template_key(settings: ModelSettings | None) -> str:
    """What identifies the template an instance was started with: "" for the GGUF's own."""
    if settings is None or settings.template is None:
        return ""
    return f"{settings.template_kind}:{hashlib.sha256(settings.template.encode()).hexdigest()[:16]}"


def template_flags(caps: Capabilities, settings: ModelSettings | None, templates_dir: Path) -> list[str]:
    """The engine flags that give an instance its model's template: `--no-jinja --chat-template NAME` for a built-in,
    or `--jinja --chat-template-file FILE` with the text written (once, named by its hash) under `templates_dir`.
    EngineIncompatible when this engine cannot take it."""
    if settings is None or settings.template is None:
        return []
    if settings.template_kind == "builtin":
        if not caps.has("--chat-template"):
            raise EngineIncompatible("--chat-template", "the model's template needs it")
        listed = engine_templates(spec.help) if (spec := caps.spec("--chat-template")) is not None else ()
        if listed and settings.template not in listed:
            raise EngineIncompatible(f"--chat-template {settings.template}", f"its built-in templates are "
                                     f"{', '.join(listed)}; blazar model set MODEL --template another")
        # NOTE: with Jinja on (this engine's default) a name is read as a Jinja text ("gemma" would be the whole
        # prompt): a built-in runs on the engine's own C++ templates, before the flag so the name is checked as one.
        return [*(["--no-jinja"] if caps.has("--no-jinja") else []), "--chat-template", settings.template]
    if not caps.has("--chat-template-file"):
        raise EngineIncompatible("--chat-template-file", "the model's Jinja template needs it")
    path = templates_dir / f"{hashlib.sha256(settings.template.encode()).hexdigest()[:32]}.jinja"
    if not path.is_file():
        templates_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(settings.template, encoding="utf-8")
        os.replace(tmp, path)  # NOTE: whole or absent: a concurrent load never reads half a template
    return [*(["--jinja"] if caps.has("--jinja") else []), "--chat-template-file", str(path)]


def reranks(metadata: ModelMetadata, settings: ModelSettings | None) -> bool:
    """Whether a model serves rerank requests: its GGUF's pooling type is rank (a classifier head scores a query
    and document pair), or its settings force rerank mode (`blazar model set NAME --rerank`)."""
    return metadata.pooling_type == "rank" or (settings is not None and settings.rerank)
