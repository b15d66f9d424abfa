"""The address a request came from, as used by sign-in limits and stored with login attempts.

This is the only place that reads ``X-Forwarded-For`` (uvicorn runs with ``proxy_headers=False``):
the header is believed only when the socket peer is one of ``settings.trusted_proxies``, and then
the answer is the right-most address that is not itself a trusted proxy, because everything to the
left of the proxies' own entries was written by the client and may be made up.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from starlette.requests import Request

from study.settings import get_settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# A peer that is not an IP address (the test client's "testclient", a Unix socket) is recorded as
# the unspecified address, so what is stored is always an IP of bounded length.
UNKNOWN_PEER = "0.0.0.0"  # noqa: S104 - a placeholder value, never bound to
# Room for a chain of about twenty proxies; anything longer is not from a proxy we run.
MAX_FORWARDED_FOR_CHARS = 1024


def client_address(request: Request) -> str:
    """The client's IP: the socket peer, or, when the peer is a trusted proxy, the right-most
    untrusted address of ``X-Forwarded-For``. A malformed or overlong header is ignored."""
    peer = _parse(request.client.host) if request.client else None
    if peer is None:
        return UNKNOWN_PEER
    proxies = trusted_networks(tuple(get_settings().trusted_proxies))
    if not _trusted(peer, proxies):
        return str(peer)
    forwarded = ",".join(request.headers.getlist("x-forwarded-for"))
    if not forwarded or len(forwarded) > MAX_FORWARDED_FOR_CHARS:
        return str(peer)
    for entry in reversed(forwarded.split(",")):
        hop = _parse(entry.strip())
        if hop is None:
            return str(peer)
        if not _trusted(hop, proxies):
            return str(hop)
    return str(peer)  # every hop was one of our proxies


def _parse(text: str) -> IPAddress | None:
    """An address in canonical form (IPv4-mapped IPv6 as IPv4), or None for anything else,
    including IPv6 zone ids, which never identify an Internet client."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id is not None:
            return None
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
    return address


def _trusted(address: IPAddress, proxies: tuple[IPNetwork, ...]) -> bool:
    return any(address.version == network.version and address in network for network in proxies)


@lru_cache(maxsize=8)
def trusted_networks(configured: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    """``trusted_proxies`` entries as networks (a bare address is a /32 or /128). An entry that is
    neither is a configuration error: ``afterward api`` checks this at start-up, and a request
    would fail rather than silently trust nobody."""
    networks = []
    for entry in configured:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError as exc:
            raise ValueError(f"AFTERWARD_TRUSTED_PROXIES: {entry!r} is not an IP address or CIDR") from exc
    return tuple(networks)
