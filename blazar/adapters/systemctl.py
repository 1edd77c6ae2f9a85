"""systemctl behind a port: `blazar service` asks it to reload, enable, stop and report a unit, and reads whether it
could (no systemctl on PATH, no running systemd, no user bus). A test passes a fake, or puts a fake `systemctl` first
on PATH; nothing here decides what a failure means."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import Protocol

TIMEOUT_S = 60.0  # `enable --now` waits for the start job (Type=exec: until the daemon's program runs)


@dataclass(frozen=True, slots=True)
class Ran:
    argv: tuple[str, ...]
    code: int | None  # None: systemctl could not be run at all (not on PATH, timed out)
    output: str  # stdout and stderr, stripped

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


class Systemctl(Protocol):
    def __call__(self, *args: str, user: bool) -> Ran: ...


def systemctl(*args: str, user: bool) -> Ran:
    """Run `systemctl [--user] ARGS` and say what came of it."""
    argv = ("systemctl", *(("--user",) if user else ()), *args)
    program = shutil.which("systemctl")
    if program is None:
        return Ran(argv, None, "systemctl is not on PATH")
    try:
        done = subprocess.run([program, *argv[1:]], capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return Ran(argv, None, f"no answer within {TIMEOUT_S:.0f} s")
    except OSError as e:
        return Ran(argv, None, str(e))
    return Ran(argv, done.returncode, (done.stdout + done.stderr).strip())
