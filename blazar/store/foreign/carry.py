"""One model from another tool's store into Blazar's: its weights (`model.imported`, source_kind the tool), then
what came with it: its projector, its LoRA adapters, its template, system prompt and parameters, its aliases.

What Blazar cannot take (a parameter it does not sample by, a projector for another model, a template it cannot
serve) is left out and said, never a failure. A step that fails otherwise removes the model again: an import that
fails leaves nothing behind."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

from blazar.adapters.mmproj_inspect import inspect_projector
from blazar.context import Blazar
from blazar.errors import BlazarError, InvalidModelSettings, ModelFileError
from blazar.events.model_settings import ParameterValue
from blazar.events.models import ModelImported, Placed
from blazar.events.projectors import ProjectorMetadata
from blazar.store.foreign.found import ForeignModel
from blazar.store.lora import add_lora
from blazar.store.model_settings import (
    MAX_DEFAULT_LORAS,
    SettingsChange,
    check_system,
    configure_model,
    known_templates,
    parse_parameter,
    parse_parameters,
    parse_template,
)
from blazar.store.models import alias_model, import_model, remove_model
from blazar.store.projectors import check_pairing, set_projector


@dataclass(frozen=True)
class Carried:
    placed: Placed
    carried: tuple[str, ...]
    not_carried: tuple[str, ...]


def settings_change(model: ForeignModel, templates: tuple[str, ...]) -> tuple[SettingsChange | None, list[str]]:
    """The settings `model` brings, as one change, and what of them Blazar cannot take (each with its reason)."""
    left: list[str] = []
    template = system = None
    if model.template is not None:
        try:
            parse_template(model.template, templates)
            template = model.template
        except InvalidModelSettings as e:
            left.append(f"{e.message} (the GGUF's own template is used)")
    if model.system is not None:
        try:
            system = check_system(model.system)
        except InvalidModelSettings as e:
            left.append(e.message)
    accepted: list[tuple[str, Any]] = []
    for key, value in model.parameters:
        try:
            parse_parameter(key, value)
            accepted.append((key, value))
        except InvalidModelSettings as e:
            left.append(e.message)
    params: dict[str, ParameterValue] = {}
    try:
        params = parse_parameters(accepted)
    except InvalidModelSettings as e:
        left.append(e.message)
    if template is None and system is None and not params:
        return None, left
    return SettingsChange(template=template, system=system, parameters=params), left


async def carry(app: Blazar, model: ForeignModel) -> Carried:
    left = list(model.not_carried)
    carried = list(model.carried)
    projector: ProjectorMetadata | None = None
    if model.projector is not None:
        try:
            projector = await asyncio.to_thread(inspect_projector, model.projector)
        except ModelFileError as e:
            left.append(f"projector: {e.message}")
            carried = [c for c in carried if c != "projector"]
    weights = list(model.weights)
    rec = await import_model(app, weights if len(weights) > 1 else weights[0], model.name, source=model.source,
                             source_kind=model.tool)
    ev = rec.event
    assert isinstance(ev, ModelImported)
    try:
        if projector is not None and model.projector is not None:
            try:
                check_pairing(model.name, ev.metadata, projector, str(model.projector))
                await set_projector(app, model.name, model.projector, metadata=projector)
            except ModelFileError as e:
                left.append(f"projector: {e.message}")
                carried = [c for c in carried if c != "projector"]
        applied: dict[str, float] = {}
        for adapter in model.adapters:
            try:
                await add_lora(app, model.name, adapter.path, adapter.name)
                applied[adapter.name] = 1.0
            except (ModelFileError, InvalidModelSettings) as e:
                left.append(f"adapter {adapter.name}: {e.message}")
        change, refused = settings_change(model, known_templates(app))
        left += refused
        if applied:  # the tool applies its adapters to every answer: so does Blazar, by default
            change = replace(change or SettingsChange(), lora=dict(list(applied.items())[:MAX_DEFAULT_LORAS]))
        if change is not None:
            await configure_model(app, model.name, change)
        for alias in getattr(model, "aliases", ()):
            try:
                await alias_model(app, alias, model.name)
            except BlazarError as e:
                left.append(f"alias {alias}: {e.message}")
    except BaseException:
        await remove_model(app, model.name)
        raise
    return Carried(ev.placed or ("hardlink" if ev.linked else "copy"), tuple(carried), tuple(left))
