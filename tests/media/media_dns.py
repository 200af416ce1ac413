"""A real DNS server on 127.0.0.1 (dnslib, UDP, random port) and an async resolver that asks it.

Answers (TTL 0, so nothing may cache them):

* ``rebind*.allowed.test``: the test-public address on odd A queries of that name, canary
  127.0.0.2 on even ones (the DNS-rebinding attacker; each test uses its own name, so the count
  starts at 1 whatever ran before);
* ``<a.b.c.d>.nip.test`` and ``<a-b-c-d>.sslip.test``: the address written in the name (wildcard
  DNS services an attacker can point anywhere);
* a static table for everything else (``TABLE``), A and AAAA separately.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections import Counter
from ipaddress import IPv4Address, IPv6Address, ip_address
from typing import Any

from dnslib import AAAA, QTYPE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer

from openai_frontend.media.addresses import IPAddress

PUBLIC_IP = IPv4Address("203.0.113.10")  # the one test "public" address; the test dialer maps it to loopback
REBIND_INWARD = IPv4Address("127.0.0.2")

TABLE: dict[str, list[str]] = {
    "allowed.test": ["203.0.113.10"],
    "cdn.allowed.test": ["203.0.113.10"],
    "mixed.allowed.test": ["203.0.113.10", "127.0.0.2"],
    "inward.allowed.test": ["127.0.0.4"],
    "private.allowed.test": ["10.0.0.5"],
    "metadata.allowed.test": ["169.254.169.254"],
    "v6inward.allowed.test": ["::1"],
    "mapped.allowed.test": ["::ffff:127.0.0.3"],
    "mixedv6.allowed.test": ["203.0.113.10", "fd00::1"],
    "evil.test": ["203.0.113.10"],
}
_NIP = re.compile(r"(?:.*\.)?(\d+\.\d+\.\d+\.\d+)\.nip\.test")
_SSLIP = re.compile(r"(?:.*\.)?(\d+-\d+-\d+-\d+)\.sslip\.test")


class FixtureResolver(BaseResolver):  # type: ignore[misc]
    def __init__(self) -> None:
        self.queries: Counter[str] = Counter()
        self._lock = threading.Lock()

    def answers(self, name: str, qtype: str) -> list[IPAddress]:
        with self._lock:
            self.queries[f"{name}/{qtype}"] += 1
            count = self.queries[f"{name}/{qtype}"]
        if name.startswith("rebind") and name.endswith(".allowed.test"):
            if qtype != "A":
                return []
            return [PUBLIC_IP] if count % 2 == 1 else [REBIND_INWARD]
        for pattern, sep in ((_NIP, "."), (_SSLIP, "-")):
            match = pattern.fullmatch(name)
            if match:
                found: list[IPAddress] = [IPv4Address(match.group(1).replace(sep, "."))]
                break
        else:
            found = [ip_address(text) for text in TABLE.get(name, [])]
        wanted = IPv4Address if qtype == "A" else IPv6Address
        return [ip for ip in found if isinstance(ip, wanted)]

    def resolve(self, request: Any, handler: Any) -> Any:
        name = str(request.q.qname).rstrip(".").lower()
        qtype = QTYPE[request.q.qtype]
        reply = request.reply()
        for ip in self.answers(name, qtype):
            rdata = A(str(ip)) if isinstance(ip, IPv4Address) else AAAA(str(ip))
            reply.add_answer(RR(request.q.qname, getattr(QTYPE, qtype), rdata=rdata, ttl=0))
        return reply


class FixtureDNS:
    """The server, its port and its resolver's query counts."""

    def __init__(self) -> None:
        self.resolver = FixtureResolver()
        self._server = DNSServer(self.resolver, address="127.0.0.1", port=0, logger=DNSLogger(logf=lambda _s: None))
        self.port: int = self._server.server.server_address[1]

    def start(self) -> None:
        self._server.start_thread()

    def stop(self) -> None:
        self._server.stop()
        self._server.server.server_close()


def _query(port: int, name: str, qtype: str) -> list[IPAddress]:
    reply = DNSRecord.parse(DNSRecord.question(name, qtype).send("127.0.0.1", port, timeout=2))
    return [ip_address(str(rr.rdata)) for rr in reply.rr if rr.rtype in (QTYPE.A, QTYPE.AAAA)]


async def dns_lookup(port: int, name: str) -> list[IPAddress]:
    """A and AAAA answers of the fixture server for ``name`` (one resolution = these two queries)."""
    found: list[IPAddress] = []
    for qtype in ("A", "AAAA"):
        found += await asyncio.to_thread(_query, port, name, qtype)
    return found
