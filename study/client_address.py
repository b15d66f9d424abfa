"""The address a request came from, as the sign-in limits count it and login attempts store it,
for every edge that signs people in (the API's requests, the dashboard's Streamlit sessions).

``X-Forwarded-For`` is believed only when the socket peer is one of ``settings.trusted_proxies``,
and then the answer is the right-most address that is not itself a trusted proxy, because
everything to the left of the proxies' own entries was written by the client and may be made up.
The edges only say what the peer and the header were (``api.client_address``,
``dashboard.auth.client_address``); the rule is here, once.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from functools import lru_cache

from study.settings import get_settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# A peer that is not an IP address (the test client's "testclient", a Unix socket, no peer at all)
# is recorded as the unspecified address, so what is stored is always an IP of bounded length.
UNKNOWN_PEER = "0.0.0.0"  # noqa: S104 - a placeholder value, never bound to
# Room for a chain of about twenty proxies; anything longer is not from a proxy we run.
MAX_FORWARDED_FOR_CHARS = 1024


def resolve(peer: str | None, forwarded_for: Sequence[str], proxies: tuple[IPNetwork, ...] | None = None) -> str:
    """The client's IP: the socket ``peer``, or, when the peer is a trusted proxy, the right-most
    untrusted address of the ``X-Forwarded-For`` header values (in the order received). A
    malformed or overlong header is ignored.

    >>> resolve("10.0.0.2", ["198.51.100.7, 10.0.0.3"], trusted_networks(("10.0.0.0/8",)))
    '198.51.100.7'
    """
    address = parse_address(peer) if peer else None
    if address is None:
        return UNKNOWN_PEER
    proxies = configured_networks() if proxies is None else proxies
    if not is_trusted(address, proxies):
        return str(address)
    forwarded = ",".join(forwarded_for)
    if not forwarded or len(forwarded) > MAX_FORWARDED_FOR_CHARS:
        return str(address)
    for entry in reversed(forwarded.split(",")):
        hop = parse_address(entry.strip())
        if hop is None:
            return str(address)
        if not is_trusted(hop, proxies):
            return str(hop)
    return str(address)  # every hop was one of our proxies


def parse_address(text: str) -> IPAddress | None:
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


def is_trusted(address: IPAddress, proxies: tuple[IPNetwork, ...]) -> bool:
    """Whether ``address`` is one of the trusted proxies."""
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


def configured_networks() -> tuple[IPNetwork, ...]:
    """The networks of ``settings.trusted_proxies``."""
    return trusted_networks(tuple(get_settings().trusted_proxies))
