"""The client's address as the console counts and records it: the TCP peer, or, when the peer is a
trusted proxy, the right-most ``X-Forwarded-For`` hop that is not one of the trusted proxies.

Anyone can send ``X-Forwarded-For``; only a proxy we run appends to it truthfully. Reading it from the
right and stopping at the first address that is not ours gives the address our outermost proxy saw,
whatever a client wrote further left. (uvicorn is started with its own proxy-header handling off, so
the peer here is the real TCP peer: ``agent.http.server.serve``.)
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
UNKNOWN = "unknown"


def networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """``["10.0.0.0/8", "192.0.2.7"]`` (the setting's format) as networks; a bare address is a /32 or /128."""
    return tuple(ipaddress.ip_network(entry.strip(), strict=False) for entry in entries)


def _address(text: str) -> Address | None:
    """An address as proxies write it: bare, ``[v6]:port`` or ``v4:port``; None when it is none of those."""
    text = text.strip()
    if text.startswith("[") and "]" in text:
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _trusted(address: Address, trusted: Sequence[Network]) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in trusted)


def client_address(peer: str | None, forwarded_for: Sequence[str], trusted: Sequence[Network]) -> str:
    """Who the console is talking to. ``forwarded_for``: every ``X-Forwarded-For`` header, in order."""
    found = _address(peer) if peer else None
    if found is None:
        return peer or UNKNOWN
    if not _trusted(found, trusted):
        return str(found)
    hops = [hop for header in forwarded_for for hop in header.split(",") if hop.strip()]
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:  # not an address: the nearest hop we can vouch for is the one before it
            break
        found = address
        if not _trusted(address, trusted):
            break
    return str(found)
