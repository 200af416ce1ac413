"""Which IP addresses the media fetcher may dial.

Owns: ``classify`` (one ``AddressClass`` per address, from the IANA special-purpose registries),
``address_allowed`` (the rule: public addresses always; private-use ranges only with the operator's
opt-out; loopback, link-local, multicast, unspecified, broadcast and reserved never), and
``parse_ipv4_literal``, which reads a URL host the way browsers and ``inet_aton`` do, so that
``127.1``, ``2130706433``, ``0x7f000001`` and ``0177.0.0.1`` are recognised as 127.0.0.1 and not
mistaken for DNS names.

IPv6 forms that carry an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible
``::a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``) are classified by the IPv4 address they
carry, so ``[::ffff:127.0.0.1]`` is loopback and ``64:ff9b::a9fe:a9fe`` is link-local. Teredo
(``2001::/32``) hides its IPv4 address and is refused outright.

Documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32) count as
public: nothing routes them, so they cannot lead inward, and tests use 203.0.113.10 as the stand-in
public address (their dialer never dials it).
"""

from __future__ import annotations

import enum
import re
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

IPAddress = IPv4Address | IPv6Address


class AddressClass(enum.Enum):
    PUBLIC = "public"
    LOOPBACK = "loopback"
    PRIVATE = "private"  # RFC 1918, local-use NAT64
    SHARED = "shared"  # CGNAT 100.64.0.0/10
    UNIQUE_LOCAL = "unique-local"  # IPv6 fc00::/7
    SITE_LOCAL = "site-local"  # IPv6 fec0::/10 (deprecated, still routed inside some networks)
    LINK_LOCAL = "link-local"  # 169.254/16 (cloud metadata), fe80::/10
    MULTICAST = "multicast"
    UNSPECIFIED = "unspecified"  # 0.0.0.0/8, ::
    BROADCAST = "broadcast"
    RESERVED = "reserved"  # everything else that is not global unicast


# Reachable only inside an organisation's network: allowed when the operator opts out of the
# private-address guard for a private deployment. Loopback and link-local stay refused even then
# (the process itself and the cloud metadata service are never media servers).
PRIVATE_USE = frozenset({AddressClass.PRIVATE, AddressClass.SHARED, AddressClass.UNIQUE_LOCAL, AddressClass.SITE_LOCAL})

_V4_TABLE: tuple[tuple[IPv4Network, AddressClass], ...] = tuple(
    (IPv4Network(net), cls)
    for net, cls in (
        ("0.0.0.0/8", AddressClass.UNSPECIFIED),
        ("10.0.0.0/8", AddressClass.PRIVATE),
        ("100.64.0.0/10", AddressClass.SHARED),
        ("127.0.0.0/8", AddressClass.LOOPBACK),
        ("169.254.0.0/16", AddressClass.LINK_LOCAL),
        ("172.16.0.0/12", AddressClass.PRIVATE),
        ("192.0.0.0/24", AddressClass.RESERVED),  # IETF protocol assignments
        ("192.88.99.0/24", AddressClass.RESERVED),  # 6to4 relay anycast
        ("192.168.0.0/16", AddressClass.PRIVATE),
        ("198.18.0.0/15", AddressClass.RESERVED),  # benchmarking, often used inside labs
        ("224.0.0.0/4", AddressClass.MULTICAST),
        ("255.255.255.255/32", AddressClass.BROADCAST),
        ("240.0.0.0/4", AddressClass.RESERVED),
    )
)

_V6_TABLE: tuple[tuple[IPv6Network, AddressClass], ...] = tuple(
    (IPv6Network(net), cls)
    for net, cls in (
        ("::/128", AddressClass.UNSPECIFIED),
        ("::1/128", AddressClass.LOOPBACK),
        ("64:ff9b:1::/48", AddressClass.PRIVATE),  # local-use NAT64
        ("100::/64", AddressClass.RESERVED),  # discard-only
        ("2001::/32", AddressClass.RESERVED),  # Teredo: the IPv4 address inside is obfuscated
        ("2001:db8::/32", AddressClass.PUBLIC),  # documentation (see the module docstring)
        ("2001::/23", AddressClass.RESERVED),  # other IETF protocol assignments
        ("fc00::/7", AddressClass.UNIQUE_LOCAL),
        ("fe80::/10", AddressClass.LINK_LOCAL),
        ("fec0::/10", AddressClass.SITE_LOCAL),
        ("ff00::/8", AddressClass.MULTICAST),
    )
)
_GLOBAL_UNICAST_V6 = IPv6Network("2000::/3")
_MAPPED = IPv6Network("::ffff:0:0/96")
_TRANSLATED = IPv6Network("::ffff:0:0:0/96")  # SIIT "IPv4-translated" form
_COMPATIBLE = IPv6Network("::/96")
_NAT64 = IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = IPv6Network("2002::/16")


def _classify_v4(ip: IPv4Address) -> AddressClass:
    for net, cls in _V4_TABLE:
        if ip in net:
            return cls
    return AddressClass.PUBLIC


def _embedded_v4(ip: IPv6Address) -> IPv4Address | None:
    if ip in _NAT64 or ip in _MAPPED or ip in _TRANSLATED:
        return IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _SIX_TO_FOUR:
        return IPv4Address((int(ip) >> 80) & 0xFFFFFFFF)
    return None


def classify(ip: IPAddress) -> AddressClass:
    """The address's class; IPv6 forms carrying an IPv4 address are classified by that address."""
    if isinstance(ip, IPv4Address):
        return _classify_v4(ip)
    ip = IPv6Address(int(ip))  # drop a scope id ("fe80::1%eth0"): the class does not depend on it
    for net, cls in _V6_TABLE:
        if ip in net:
            return cls
    embedded = _embedded_v4(ip)
    if embedded is not None:
        return _classify_v4(embedded)
    if ip in _COMPATIBLE:
        # Deprecated IPv4-compatible form: inward when its IPv4 address is, and refused anyway.
        inner = _classify_v4(IPv4Address(int(ip) & 0xFFFFFFFF))
        return AddressClass.RESERVED if inner is AddressClass.PUBLIC else inner
    if ip not in _GLOBAL_UNICAST_V6:
        return AddressClass.RESERVED
    return AddressClass.PUBLIC


def address_allowed(ip: IPAddress, *, allow_private: bool) -> bool:
    """True when the fetcher may dial ``ip`` under the private-address setting."""
    cls = classify(ip)
    return cls is AddressClass.PUBLIC or (allow_private and cls in PRIVATE_USE)


_NUMBER = re.compile(r"(?:0[xX][0-9a-fA-F]*|[0-9]+)\Z")


def _ipv4_part(text: str) -> int | None:
    if not _NUMBER.match(text):
        return None
    if text[:2] in ("0x", "0X"):
        return int(text[2:] or "0", 16)
    if len(text) > 1 and text.startswith("0"):
        return int(text, 8) if all(c in "01234567" for c in text) else None
    return int(text)


def ends_in_number(host: str) -> bool:
    """The WHATWG rule: a host whose last label is numeric must be an IPv4 address (or is invalid)."""
    labels = host.split(".")
    if labels and labels[-1] == "" and len(labels) > 1:
        labels.pop()
    return bool(labels) and bool(_NUMBER.match(labels[-1]))


def parse_ipv4_literal(host: str) -> IPv4Address | None:
    """``host`` read as an IPv4 literal in any form ``inet_aton`` accepts, or None when it is not one.

    Raises ValueError for a host that ends in a number but is not a valid address (``1.2.3.999``):
    such a host is neither a usable name nor an address.
    """
    if not ends_in_number(host):
        return None
    labels = host.split(".")
    if labels[-1] == "":
        labels.pop()
    if len(labels) > 4:
        raise ValueError("too many parts for an IPv4 address")
    numbers = [_ipv4_part(label) for label in labels]
    if any(n is None for n in numbers):
        raise ValueError("not an IPv4 address")
    values = [n for n in numbers if n is not None]
    *head, last = values
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(values)):
        raise ValueError("IPv4 part out of range")
    value = last
    for i, n in enumerate(head):
        value += n << (8 * (3 - i))
    return IPv4Address(value)
