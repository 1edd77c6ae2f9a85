"""What kind of address a host is: only this machine's (loopback), or every interface (unspecified). Pure."""

from __future__ import annotations

import ipaddress


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
