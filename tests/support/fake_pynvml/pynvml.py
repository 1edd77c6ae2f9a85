"""`import pynvml` in a subprocess whose PYTHONPATH starts here: tests/support/fake_nvml.py's fake, described by the
FAKE_NVML environment variable."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))

from tests.support.fake_nvml import FakeNvml, NVMLError

_fake = FakeNvml.from_json(os.environ.get("FAKE_NVML", '{"fail": true}'))
for _name in dir(_fake):
    if _name.startswith("nvml"):
        globals()[_name] = getattr(_fake, _name)
__all__ = ["NVMLError"]
