"""Fetching an http(s) image URL a chat request names (setting `image_fetch`, off by default): the one place the gateway
reaches out on a client's behalf, so it is bounded and never a way into the machine's own network.

Every host is resolved here and each address checked (only global addresses, unless the admin named the host in
`image_fetch_allow_hosts`); the connection then goes to exactly the addresses checked (the resolver is this module's,
so a second DNS answer cannot swap them). Redirects are followed by hand, each hop checked again; the body is bounded
in bytes and the whole fetch in time; the content type must say image. What comes back is checked by its bytes after
(blazar/adapters/images.py).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from blazar.errors import DialectError

MAX_REDIRECTS = 3
_ALLOW = " (an admin may allow the host with image_fetch_allow_hosts)"


def _refused(url: str, why: str) -> DialectError:
    return DialectError(f"image URL {_shown(url)}: {why}", code="image_fetch_refused")


def _shown(url: str) -> str:
    return repr(url if len(url) <= 120 else url[:117] + "...")


def is_public(address: str) -> bool:
    """Whether `address` is one a fetch may reach without the admin's say-so: a global unicast address (not private,
    loopback, link-local, shared, reserved, multicast or unspecified; an IPv4-mapped IPv6 address as its IPv4)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class _CheckedResolver(AbstractResolver):
    """DNS for the fetch: every address a host resolves to must be public (or the host allowed); the connection uses
    only the addresses returned here, the ones checked."""

    def __init__(self, allow_hosts: Sequence[str]) -> None:
        self.allow = frozenset(h.lower().strip("[]") for h in allow_hosts)

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, family=socket.AF_UNSPEC)
        except OSError as e:
            raise OSError(f"cannot resolve {host}: {e}") from None
        allowed = host.lower().strip("[]") in self.allow
        out: list[ResolveResult] = []
        for fam, _, proto, _, sockaddr in infos:
            address = str(sockaddr[0])
            if not allowed and not is_public(address):
                # NOTE: one non-global answer refuses the host outright, rather than trying the others: a name that
                # resolves into the private network is not one to reach on a client's behalf.
                raise PermissionError(f"{host} resolves to {address}, not a public address{_ALLOW}")
            out.append(ResolveResult(hostname=host, host=address, port=int(sockaddr[1]), family=fam, proto=proto,
                                     flags=socket.AI_NUMERICHOST))
        if not out:
            raise OSError(f"cannot resolve {host}")
        return out

    async def close(self) -> None:
        return None


async def fetch_image(url: str, *, max_bytes: int, timeout_s: float, allow_hosts: Sequence[str]) -> bytes:
    """The bytes at `url` (http or https), or a DialectError (400) saying why not: another scheme, credentials in
    the URL, a non-public address, a status other than 200 after at most MAX_REDIRECTS redirects, a content type that
    is not an image, more than `max_bytes`, or longer than `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _fetch(url, max_bytes=max_bytes, allow_hosts=allow_hosts)
    except TimeoutError:
        raise _refused(url, f"not fetched within {timeout_s:g} s (inputs.image_fetch_timeout_s)") from None


async def _fetch(url: str, *, max_bytes: int, allow_hosts: Sequence[str]) -> bytes:
    resolver = _CheckedResolver(allow_hosts)
    connector = aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False, force_close=True)
    async with aiohttp.ClientSession(connector=connector, trust_env=False, auto_decompress=True) as session:
        current = url
        for _ in range(MAX_REDIRECTS + 1):
            try:
                _check_url(current, resolver.allow)
                async with session.get(current, allow_redirects=False, headers={"Accept": "image/*"}) as resp:
                    if resp.status in (301, 302, 303, 307, 308):
                        location = resp.headers.get("Location")
                        if not location:
                            raise _refused(current, f"a {resp.status} redirect without a Location")
                        current = urljoin(current, location)
                        continue
                    if resp.status != 200:
                        raise _refused(current, f"the server answered {resp.status}")
                    ctype = resp.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
                    if not ctype.startswith("image/"):
                        raise _refused(current, f"the server says it is {ctype or 'untyped'}, not an image")
                    return await _bounded(resp, current, max_bytes)
            except PermissionError as e:  # a refused address (an OSError, as aiohttp expects of a resolver)
                raise _refused(current, str(e)) from None
            except aiohttp.ClientConnectorError as e:
                cause: Any = e.os_error
                if isinstance(cause, PermissionError):
                    raise _refused(current, str(cause)) from None
                raise _refused(current, f"cannot connect ({cause})") from None
            except aiohttp.ClientError as e:
                raise _refused(current, f"the fetch failed ({type(e).__name__}: {e})") from None
        raise _refused(url, f"more than {MAX_REDIRECTS} redirects")


def _check_url(url: str, allow: frozenset[str]) -> None:
    parts = urlsplit(url)
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        raise _refused(url, "only http(s) URLs with a host are fetched")
    if parts.username or parts.password:
        raise _refused(url, "credentials in an image URL are not sent")
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return  # a name: checked where it is resolved (_CheckedResolver)
    # NOTE: aiohttp connects to an address literal without asking the resolver: it is checked here instead.
    if host.lower() not in allow and not is_public(host):
        raise PermissionError(f"{host} is not a public address{_ALLOW}")


async def _bounded(resp: aiohttp.ClientResponse, url: str, max_bytes: int) -> bytes:
    declared = resp.content_length
    if declared is not None and declared > max_bytes:
        raise _refused(url, f"{declared} bytes, over the {max_bytes} a request's images may take "
                            "(inputs.image_max_mib)")
    out = bytearray()
    async for chunk in resp.content.iter_chunked(64 << 10):
        out += chunk
        if len(out) > max_bytes:
            raise _refused(url, f"over the {max_bytes} bytes a request's images may take (inputs.image_max_mib)")
    return bytes(out)
