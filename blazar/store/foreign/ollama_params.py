"""An Ollama model's parameters (its `params` layer: JSON such as {"num_ctx": 8192, "stop": ["<|im_end|>"],
"temperature": 0.7}) as the (name, value) pairs a `ForeignModel` carries: the ones Blazar's model settings take
(store/model_settings.py `parse_parameter`, the same check Ollama's /api/create gets), each of the rest with why not.
"""

from __future__ import annotations

import json
from typing import Any

from blazar.errors import InvalidModelSettings
from blazar.store.model_settings import MAX_STOPS, parse_parameter, parse_parameters

# Ollama's options that Blazar decides itself, or that llama-server has no setting for, in words for the table.
_WHY: dict[str, str] = {
    "num_gpu": "Blazar's memory planner chooses the layers offloaded per machine (blazar fit shows its plan)",
    "num_thread": "Blazar's memory planner chooses threads per machine",
    "num_batch": "Blazar's memory planner chooses the batch per machine",
    "main_gpu": "Blazar's memory planner chooses the devices per machine",
    "use_mmap": "Blazar decides how the engine maps the weights",
    "use_mlock": "Blazar decides how the engine maps the weights",
    "penalize_newline": "llama-server has no such setting (Ollama itself ignores it now)",
}


def carried_parameters(params: dict[str, Any]) -> tuple[tuple[tuple[str, str], ...], list[str], list[str]]:
    """(the pairs carried, what is carried in words, what is not with its reason). Stops beyond what a model's
    settings hold are left out, said so."""
    pairs: list[tuple[str, str]] = []
    carried: list[str] = []
    left: list[str] = []
    for key in sorted(params):
        value = params[key]
        if key in _WHY:
            left.append(f"{key}: {_WHY[key]}")
            continue
        try:
            name, typed = parse_parameter(key, value)
        except InvalidModelSettings as e:
            left.append(f"{key}: {e.message}")
            continue
        if isinstance(typed, list):  # stop: one pair per string, as a Modelfile has one PARAMETER line per stop
            kept = typed[:MAX_STOPS]
            pairs += [(name, s) for s in kept]
            carried.append(f"{name} ({len(kept)})")
            if len(typed) > len(kept):
                left.append(f"{name}: {len(typed) - len(kept)} stop strings past the {MAX_STOPS} a model holds")
        else:
            pairs.append((name, json.dumps(typed)))
            carried.append(f"{name}={json.dumps(value)}")  # as Ollama had it
    try:
        parse_parameters(pairs)
    except InvalidModelSettings as e:  # together they exceed what `model.configured` holds
        return (), [], [*left, f"parameters: {e.message}"]
    return tuple(pairs), carried, left
