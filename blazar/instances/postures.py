"""Which posture this machine loads a model at: the model's adopted profile as the log says it is now, judged against
the active engine build and this machine's fingerprint (probed once: it asks the GPUs) by the pure
`choose_posture` (blazar/instances/posture_choice.py); a stale profile is said in the daemon's log and passed by.
The supervisor asks before it makes room (the posture shapes the fit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from blazar.context import Blazar
from blazar.events.tuning import Machine
from blazar.instances.posture_choice import PostureChoice, choose_posture
from blazar.projections.profiles import profile
from blazar.store.engines import ActiveEngine

log = logging.getLogger("blazar.supervisor")


class Postures:
    def __init__(self, app: Blazar, machine: Callable[[], Machine]) -> None:
        self.app = app
        self._machine = machine
        self._fingerprint: str | None = None  # this machine's, once a posture is first chosen

    def for_load(self, name: str, engine: ActiveEngine | None) -> PostureChoice:
        """The adopted profile's posture when it was measured on `engine` (a llama-server model's); a stale one is
        said and passed by."""
        if engine is None:
            return PostureChoice()
        adopted = profile(self.app.runner.state("profiles"), name)
        if adopted is not None and self._fingerprint is None:
            self._fingerprint = self._machine().fingerprint
        choice = choose_posture(adopted, engine.tag, self._fingerprint)
        if choice.stale is not None:
            log.warning("%s: profile.adopted seq %s is stale (%s): loading at the defaults; run blazar tune %s again",
                        name, choice.stale_seq, choice.stale, name)
        return choice
