"""The CLI's admin credential: a fresh random token the daemon writes to run/admin.token (mode 0600, atomically) at
start and removes at exit. Whoever can read that file is the home's owner, so the CLI on the same machine keeps
working once keys are on (it sends the token as a Bearer secret); the token is never logged or recorded."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from blazar.paths import Paths

# Not shaped like a key ("blz_..."), so a key prefix can never look it up.
TOKEN_PREFIX = "blzadm_"


def admin_token_file(paths: Paths) -> Path:
    return paths.run / "admin.token"


def write_admin_token(paths: Paths) -> str:
    """A new token, written where only this user can read it; replaces any earlier one."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    target = admin_token_file(paths)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask, and whatever mode a stale tmp file had
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    os.replace(tmp, target)
    return token


def read_admin_token(paths: Paths) -> str | None:
    try:
        token = admin_token_file(paths).read_text().strip()
    except OSError:
        return None
    return token or None


def remove_admin_token(paths: Paths, token: str) -> None:
    """Remove the file if it still holds `token` (a newer daemon's token is left alone)."""
    with contextlib.suppress(OSError):
        if read_admin_token(paths) == token:
            admin_token_file(paths).unlink()
