"""A CLI on a pseudo-terminal, as a user's shell runs it: its own session with the pty as its controlling terminal,
so Ctrl-C typed there reaches it as SIGINT and closing the terminal hangs it up (`blazar run` chatting, `blazar
watch`)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Mapping

from tests.support.daemon import WAIT_S


def _take_terminal(ignore_hangups: bool) -> None:
    """In the child: a session of its own whose controlling terminal is the pty on stdin (SIGHUP ignored first, as
    under nohup, with `ignore_hangups`)."""
    if ignore_hangups:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Pty:
    """`blazar ARGS` on a pseudo-terminal of its own."""

    def __init__(self, args: list[str], env: Mapping[str, str], *, ignore_hangups: bool = False) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "blazar.cli.main", *args], env=dict(env), stdin=slave,
                                     stdout=slave, stderr=slave, preexec_fn=lambda: _take_terminal(ignore_hangups))
        os.close(slave)
        self.seen = b""

    def expect(self, needle: bytes, timeout: float = WAIT_S) -> bytes:
        """What the terminal showed before `needle`, once it shows it (an AssertionError after `timeout`)."""
        deadline = time.monotonic() + timeout
        while needle not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {needle!r}; the terminal shows:\n{self.seen.decode()}")
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    self.seen += os.read(self.master, 4096)
                except OSError:  # the child closed the terminal
                    raise AssertionError(f"exited while waiting for {needle!r}:\n{self.seen.decode()}") from None
        before, _, self.seen = self.seen.partition(needle)
        return before

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def hang_up(self) -> None:
        """Close the terminal: the child's reads of it end (SIGHUP too, unless it ignores that)."""
        if self.master >= 0:
            os.close(self.master)
            self.master = -1

    def close(self) -> int:
        """Wait for the child to exit (its code), then close the terminal."""
        try:
            return self.proc.wait(timeout=WAIT_S)
        finally:
            self.hang_up()

    def kill(self) -> None:
        """Whatever state it is in: the child killed and reaped, the terminal closed."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.hang_up()
