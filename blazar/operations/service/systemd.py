"""The systemd unit: written from a `Target` (`render`), and read back (`read`) to say which install and home an
installed unit runs. Values are quoted by systemd's rules, so a home with spaces, `%`, `$` or quotes in its path
survives: each word double-quoted with `\\` and `"` escaped, `%` doubled (specifiers), and in ExecStart `$` doubled
(variable expansion). Why each hardening line is there, and what is left out for llama-server: docs/5.OPERATIONS.md,
"Run as a service"."""

from __future__ import annotations

from dataclasses import dataclass, field

from blazar import __version__
from blazar.errors import ServiceError
from blazar.operations.service.target import Scope, Target

# The daemon's own stop (requests finish within stop_grace_s, then each child gets SIGTERM and stop_grace_s more)
# at the default 10 s, with room to spare: raise it beside a larger stop_grace_s.
TIMEOUT_STOP_S = 90
RESTART_S = 5
# Exit codes a restart cannot cure: 2 bad input (config.toml, the log location), 9 a bind wider than loopback
# with no key (blazar/errors.py).
NO_RESTART_EXIT = "2 9"
# Everything the daemon needs stays: /dev (GPUs: /dev/nvidia*, /dev/dri, /dev/kfd; so no PrivateDevices, DeviceAllow
# or ProtectClock, which implies a device list), writable and executable memory (CUDA's JIT), mmap of the models, exec
# of the engines under the home. Namespaced lines in a user unit need user namespaces (systemd >= 253 sets them up).
HARDENING = (
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectHostname", "yes"),
    ("RestrictNamespaces", "yes"),
    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK"),
    ("RestrictSUIDSGID", "yes"),
    ("RestrictRealtime", "yes"),
    ("LockPersonality", "yes"),
    ("SystemCallArchitectures", "native"),
)
_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "s": " "}


def quote(word: str, *, exec_arg: bool = False) -> str:
    """One word as systemd reads it back unchanged. A control character (a newline would end the line) is refused."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in word):
        raise ServiceError(f"{word!r}: a control character cannot be written into a systemd unit; use a path "
                           "without one")
    body = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if exec_arg:
        body = body.replace("$", "$$")
    return f'"{body}"'


def exec_start(argv: tuple[str, ...]) -> str:
    """ExecStart's value. systemd expands no variable in the program's path, and refuses one holding `"` or `\\`
    ("Executable name contains special characters"): such an install is refused here, before anything is written."""
    program, *args = argv
    if '"' in program or "\\" in program:
        raise ServiceError(f"{program}: systemd cannot run a program whose path holds a quote or a backslash; "
                           "install Blazar under another directory")
    return " ".join([quote(program), *(quote(a, exec_arg=True) for a in args)])


def render(t: Target, scope: Scope) -> str:
    """The unit file for `t`: a user unit (started with the user's session manager, `default.target`) or a system
    unit (at boot, `multi-user.target`, as `t.user`)."""
    unit = ["[Unit]", "Description=Blazar: local AI inference (the daemon, its engines stopped with it)"]
    if scope == "system":  # a user manager has no network-online.target
        unit += ["After=network-online.target", "Wants=network-online.target"]
    # A crash loop ends after 5 starts in 5 minutes (`systemctl reset-failed blazar` to try again).
    unit += ["StartLimitIntervalSec=300", "StartLimitBurst=5"]
    service = ["[Service]", "Type=exec",
               f"ExecStart={exec_start(t.argv)}",
               *(f"Environment={quote(f'{k}={v}')}" for k, v in t.env)]
    if scope == "system":  # a user manager holds no capabilities to drop, and runs as its user already
        service += [*([f"User={t.user}"] if t.user else []), "CapabilityBoundingSet=", "RemoveIPC=yes"]
    service += ["Restart=on-failure", f"RestartSec={RESTART_S}", f"RestartPreventExitStatus={NO_RESTART_EXIT}",
                "# SIGTERM to the daemon alone: it stops its engines itself and records each stop; whatever is left",
                "# when it has exited (or at TimeoutStopSec) gets SIGKILL.",
                "KillMode=mixed", f"TimeoutStopSec={TIMEOUT_STOP_S}", "UMask=0077",
                *(f"{k}={v}" for k, v in HARDENING),
                *_private_tmp(t.writable),
                # `-`: a directory missing at start (an archive_dir not made yet) is skipped, not a failed start.
                "ReadWritePaths=" + " ".join(quote(f"-{p}") for p in t.writable)]
    install = ["[Install]", f"WantedBy={'default.target' if scope == 'user' else 'multi-user.target'}"]
    head = [f"# Written by `blazar service install` (blazar {__version__}). Install again rather than edit it;",
            f"# local additions go in a drop-in: systemctl{' --user' if scope == 'user' else ''} edit blazar"]
    return "\n".join([*head, "", *unit, "", *service, "", *install]) + "\n"


def _private_tmp(writable: tuple[str, ...]) -> list[str]:
    """A private /tmp, unless the home is in the shared one: the service would not see it (and fail to start)."""
    shared = [p for p in writable if any(p == d or p.startswith(f"{d}/") for d in ("/tmp", "/var/tmp"))]
    if shared:
        return [f"# No PrivateTmp: {shared[0]} is in the shared /tmp, which a private one would hide."]
    return ["PrivateTmp=yes"]


@dataclass(frozen=True, slots=True)
class Seen:
    """What an installed unit runs, as systemd would read its [Service] section (drop-ins are not read)."""

    argv: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None


def read(text: str, *, user_home: str) -> Seen:
    """ExecStart's words (its prefixes `-@:+!` dropped), Environment's variables and User=, unquoted; `%h` is
    `user_home`, `%%` a `%`, other specifiers stay as written."""
    argv: tuple[str, ...] = ()
    env: dict[str, str] = {}
    user: str | None = None
    section = ""
    for line in _logical_lines(text):
        if line.startswith("["):
            section = line.strip()
            continue
        key, sep, value = line.partition("=")
        if not sep or section != "[Service]":
            continue
        key, value = key.strip(), value.strip()
        if key == "ExecStart":
            words = [_specifiers(w, user_home) for w in split(value)]
            words[1:] = [w.replace("$$", "$") for w in words[1:]]
            if words:
                words[0] = words[0].lstrip("-@:+!")
            argv = tuple(words)
        elif key == "Environment":
            if not value:
                env.clear()
            for word in split(value):
                name, eq, val = _specifiers(word, user_home).partition("=")
                if eq:
                    env[name] = val
        elif key == "User":
            user = value or None
    return Seen(argv=argv, env=env, user=user)


def _logical_lines(text: str) -> list[str]:
    """Lines with comments dropped and a trailing backslash joining the next line."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped[0] in "#;"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    if pending:
        lines.append(pending)
    return lines


def split(value: str) -> list[str]:
    """systemd's word splitting: whitespace between words, single or double quotes, C escapes."""
    words: list[str] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and value[i] in " \t":
            i += 1
        if i >= n:
            break
        word: list[str] = []
        quote_char = ""
        while i < n:
            c = value[i]
            if c == "\\" and i + 1 < n:
                i, ch = _escape(value, i + 1)
                word.append(ch)
                continue
            if quote_char:
                if c == quote_char:
                    quote_char = ""
                else:
                    word.append(c)
            elif c in "\"'":
                quote_char = c
            elif c in " \t":
                break
            else:
                word.append(c)
            i += 1
        words.append("".join(word))
    return words


def _escape(value: str, i: int) -> tuple[int, str]:
    """The character a backslash escape at value[i] stands for, and where reading goes on."""
    c = value[i]
    if c == "x" and _is_hex(value[i + 1:i + 3]):
        return i + 3, chr(int(value[i + 1:i + 3], 16))
    return i + 1, _C_ESCAPES.get(c, c)


def _is_hex(s: str) -> bool:
    return len(s) == 2 and all(ch in "0123456789abcdefABCDEF" for ch in s)


def _specifiers(word: str, user_home: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(word):
        if word[i] == "%" and i + 1 < len(word) and word[i + 1] in "%h":
            out.append("%" if word[i + 1] == "%" else user_home)
            i += 2
            continue
        out.append(word[i])
        i += 1
    return "".join(out)
