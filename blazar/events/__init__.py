"""WHAT HAPPENED: typed events, the registry that decodes them, and the append-only log that stores them.

Importing this package registers every event type.
"""

from blazar.events import archive as archive
from blazar.events import audio as audio
from blazar.events import batches as batches
from blazar.events import doctor as doctor
from blazar.events import engines as engines
from blazar.events import instances as instances
from blazar.events import keys as keys
from blazar.events import lora as lora
from blazar.events import model_settings as model_settings
from blazar.events import models as models
from blazar.events import nodes as nodes
from blazar.events import projectors as projectors
from blazar.events import realtime as realtime
from blazar.events import remotes as remotes
from blazar.events import requests as requests
from blazar.events import reshapes as reshapes
from blazar.events import responses as responses
from blazar.events import sessions as sessions
from blazar.events import swaps as swaps
from blazar.events import system as system
from blazar.events import tuning as tuning
from blazar.events import workers as workers
from blazar.events.base import Event, Pending, Recorded
from blazar.events.types import decode, encode, event_class, known_types, register, upcaster

__all__ = [
    "Event",
    "Pending",
    "Recorded",
    "decode",
    "encode",
    "event_class",
    "known_types",
    "register",
    "upcaster",
]
