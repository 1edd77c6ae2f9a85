"""Which posture a load of a model runs at: its adopted profile (blazar/projections/profiles.py) when that was
measured on the active engine build, else the defaults, with the reason the profile was passed by. Pure: the
supervisor asks before it makes room (the posture shapes the fit) and the spawner puts the rest on the argv."""

from __future__ import annotations

from dataclasses import dataclass

from blazar.events.tuning import Posture
from blazar.projections.profiles import Profile, stale_reason


@dataclass(frozen=True)
class PostureChoice:
    """The posture to load at (None: the defaults) and the profile.adopted that chose it; or, when the profile is
    stale, its seq and why it was not applied."""

    posture: Posture | None = None
    profile_seq: int | None = None
    stale_seq: int | None = None
    stale: str | None = None


def choose_posture(profile: Profile | None, engine_tag: str | None,
                   machine_fingerprint: str | None = None) -> PostureChoice:
    """The adopted profile's posture when it applies on `engine_tag` (and this machine, when its fingerprint is
    given); a default posture adopted is no posture at all (the plain load, with its profile named)."""
    if profile is None:
        return PostureChoice()
    why = stale_reason(profile, engine_tag, machine_fingerprint)
    if why is not None:
        return PostureChoice(stale_seq=profile.seq, stale=why)
    return PostureChoice(posture=None if profile.posture.is_default() else profile.posture, profile_seq=profile.seq)
