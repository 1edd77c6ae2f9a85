"""What kind of address a host is: only this machine's (loopback), or every interface (unspecified); and whether a
URL would carry what is sent to it in clear across a network. Pure."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def is_loopback(host: str) -> bool:
    """True for an address or name that only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_unspecified(host: str) -> bool:
    """True for a wildcard bind (0.0.0.0, ::): every interface at once."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def in_clear_off_host(url: str) -> bool:
    """True for a URL whose traffic crosses a network unencrypted: plain http to a host other than loopback (a name
    other than localhost counts as off this machine: what it resolves to is not ours to know)."""
    parts = urlsplit(url)
    return parts.scheme.lower() != "https" and not is_loopback(parts.hostname or "")
