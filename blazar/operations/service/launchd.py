"""The launchd agent for macOS (~/Library/LaunchAgents/dev.blazar.plist): started at login, restarted when it exits
with a failure, its output in the home's log/ directory. Written and read back here; loading it is the user's
`launchctl bootstrap` (printed by install). NOTE: rendered and parsed in the tests, never run on a Mac by them."""

from __future__ import annotations

import plistlib
from typing import Any

from blazar.operations.service.systemd import TIMEOUT_STOP_S, Seen
from blazar.operations.service.target import Target

LABEL = "dev.blazar"
PLIST_NAME = f"{LABEL}.plist"


def render(t: Target) -> bytes:
    plist: dict[str, Any] = {
        "Label": LABEL,
        "ProgramArguments": list(t.argv),
        "EnvironmentVariables": dict(t.env),
        "RunAtLoad": True,
        # Restarted when it exits with a failure (or a signal); a clean stop (exit 0) stays stopped.
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": 10,
        # launchd's SIGTERM → SIGKILL delay: the daemon stops its engines within it (systemd's TimeoutStopSec).
        "ExitTimeOut": TIMEOUT_STOP_S,
        "StandardOutPath": f"{t.log_dir}/service.out.log",
        "StandardErrorPath": f"{t.log_dir}/service.err.log",
        "ProcessType": "Standard",
    }
    return plistlib.dumps(plist, fmt=plistlib.FMT_XML, sort_keys=True)


def read(data: bytes) -> Seen:
    """What an installed agent runs (an unreadable plist reads as running nothing)."""
    try:
        plist = plistlib.loads(data)
    except (plistlib.InvalidFileException, ValueError):
        return Seen()
    if not isinstance(plist, dict):
        return Seen()
    argv = plist.get("ProgramArguments")
    env = plist.get("EnvironmentVariables")
    return Seen(argv=tuple(str(a) for a in argv) if isinstance(argv, list) else (),
                env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {})
