"""The argv flags of a tuned posture (blazar/events/tuning.py) that are not the fit's: speculative decoding and its
draft model. Built only from flags the binary lists (`--help` churns between builds): a posture this build cannot
run is EngineIncompatible, naming the flag."""

from __future__ import annotations

from pathlib import Path

from blazar.adapters.engines.llama_server import Capabilities
from blazar.errors import EngineIncompatible
from blazar.events.tuning import Posture

_SPEC_TYPE = ("--spec-type",)
_DRAFT_MODEL = ("--spec-draft-model", "-md", "--model-draft")
_DRAFT_N_MAX = ("--spec-draft-n-max", "--draft-max", "--draft-n", "--draft")


def spec_types(caps: Capabilities) -> tuple[str, ...]:
    """The speculation types this build offers (`--spec-type none,draft-simple,ngram-simple,...`), "none" left out."""
    spec = caps.spec(*_SPEC_TYPE)
    if spec is None:
        return ()
    listed = spec.choices or tuple(v for v in (spec.metavar or "").split(",") if v and v.strip() == v)
    return tuple(v for v in listed if v != "none")


def ngram_types(caps: Capabilities) -> tuple[str, ...]:
    """The self-speculation types (no draft model): every `ngram-*` the build lists."""
    return tuple(t for t in spec_types(caps) if t.startswith("ngram"))


def _name(caps: Capabilities, names: tuple[str, ...], why: str) -> str:
    spec = caps.spec(*names)
    if spec is None:
        raise EngineIncompatible(names[0], why)
    return next((n for n in names if n in spec.names), spec.names[0])


def posture_flags(caps: Capabilities, posture: Posture | None, draft: Path | None = None) -> list[str]:
    """`--spec-type T [--spec-draft-model DRAFT] [--spec-draft-n-max N]` for a speculative posture; [] otherwise.
    `draft` is the draft model's file (already confined to the store) when the posture names one."""
    if posture is None or not posture.speculative:
        return []
    assert posture.spec_type is not None
    why = f"the posture's speculative decoding ({posture.spec_type})"
    if posture.spec_type not in spec_types(caps):
        offered = ", ".join(spec_types(caps)) or "none"
        raise EngineIncompatible(f"--spec-type {posture.spec_type}", f"{why} (this build offers {offered})")
    argv = [_name(caps, _SPEC_TYPE, why), posture.spec_type]
    if posture.spec_type.startswith("draft"):
        if draft is None:
            raise EngineIncompatible(f"--spec-type {posture.spec_type}", f"{why} needs a draft model")
        argv += [_name(caps, _DRAFT_MODEL, why), str(draft)]
    if posture.spec_n_max is not None:
        argv += [_name(caps, _DRAFT_N_MAX, why), str(posture.spec_n_max)]
    return argv
