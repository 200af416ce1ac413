"""The one URL parser of the media layer.

Owns: ``RemoteURL`` and ``parse_remote_url``, plus ``join_location`` for redirect targets. The
parsed object is what the policy checks *and* what the fetcher connects with (host, port, request
target), so no second parser can disagree about the host (CVE-2026-24779: a backslash made two
parsers see different hosts).

The parser is deliberately strict instead of lenient-and-normalising: anything a browser, curl and
Python's ``urllib`` might read differently is refused. That means printable ASCII only (IDN
look-alikes must arrive as ``xn--`` labels, which then have to match the allow-list exactly), no
backslash, no user-info (``allowed.test@127.0.0.1``), no percent-encoded host, no IPv6 zone id, no
empty port. Host names are lower-cased and lose one trailing dot; numeric hosts are read as IPv4
in every ``inet_aton`` form (``addresses.parse_ipv4_literal``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from ipaddress import IPv6Address

from openai_frontend.media.addresses import IPAddress, parse_ipv4_literal

MAX_URL_CHARS = 8192
DEFAULT_PORTS = {"http": 80, "https": 443}

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_PRINTABLE = re.compile(r"[\x21-\x7e]+\Z")
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\Z")


class URLError(ValueError):
    """Not a URL this layer accepts; ``scheme_refused`` when only the scheme is at fault."""

    def __init__(self, reason: str, *, scheme_refused: bool = False) -> None:
        super().__init__(reason)
        self.scheme_refused = scheme_refused


@dataclass(frozen=True)
class RemoteURL:
    """An http(s) URL after parsing: everything the policy checks and the fetcher uses."""

    scheme: str  # "http" | "https"
    host: str  # lower-case DNS name without trailing dot, or the canonical IP text
    ip: IPAddress | None  # the address when the host is an IP literal (then never resolved)
    port: int
    target: str  # path and query for the request line; never empty, no fragment

    @property
    def host_header(self) -> str:
        """``Host`` header value (and, without the port, the TLS server name)."""
        host = f"[{self.host}]" if isinstance(self.ip, IPv6Address) else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"

    @property
    def file_name(self) -> str:
        """The last path segment (its extension may declare a media type)."""
        return self.target.split("?", 1)[0].rsplit("/", 1)[-1]

    @property
    def origin(self) -> str:
        return f"{self.scheme}://{self.host_header}"

    def __str__(self) -> str:
        return self.origin + self.target


def url_scheme(text: str) -> str | None:
    """The lower-cased scheme of ``text`` when it starts with one (``file``, ``data``, ``http``...)."""
    match = _SCHEME.match(text)
    return match.group(1).lower() if match else None


def _parse_host(text: str) -> tuple[str, IPAddress | None]:
    if text.startswith("["):
        if not text.endswith("]") or "%" in text:
            raise URLError("bad IPv6 literal")
        try:
            ip6 = IPv6Address(text[1:-1])
        except ValueError as exc:
            raise URLError("bad IPv6 literal") from exc
        return str(ip6), ip6
    if not text or "%" in text:
        raise URLError("empty or percent-encoded host")
    try:
        ip4 = parse_ipv4_literal(text)
    except ValueError as exc:
        raise URLError("numeric host is not an IPv4 address") from exc
    if ip4 is not None:
        return str(ip4), ip4
    name = text.lower()
    if name.endswith("."):
        name = name[:-1]
    if len(name) > 253 or not all(_LABEL.match(label) for label in name.split(".")):
        raise URLError("host is not a valid DNS name")
    return name, None


def _split_authority(authority: str) -> tuple[str, str | None]:
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise URLError("bad IPv6 literal")
        rest = authority[end + 1 :]
        if rest and not rest.startswith(":"):
            raise URLError("junk after IPv6 literal")
        return authority[: end + 1], rest[1:] if rest else None
    host, colon, port = authority.partition(":")
    return host, port if colon else None


def parse_authority(authority: str) -> tuple[str, IPAddress | None, int | None]:
    """``host[:port]`` -> (normalised host, its address if it is an IP literal, the port or None).

    Shared by request URLs and allow-list entries, so both sides compare the same normal forms.
    """
    if "@" in authority:
        raise URLError("user-info in URL")
    host_text, port_text = _split_authority(authority)
    host, ip = _parse_host(host_text)
    if port_text is None:
        return host, ip, None
    if port_text.isdigit() and len(port_text) <= 5 and 0 < int(port_text) < 65536:
        return host, ip, int(port_text)
    raise URLError("bad port")


def parse_remote_url(text: str) -> RemoteURL:
    """Parse an ``http``/``https`` URL; raise ``URLError`` for anything else or anything ambiguous."""
    if len(text) > MAX_URL_CHARS or not _PRINTABLE.match(text) or "\\" in text:
        raise URLError("URL has characters outside printable ASCII, or a backslash")
    scheme = url_scheme(text)
    if scheme not in DEFAULT_PORTS:
        raise URLError("scheme is not http or https", scheme_refused=True)
    rest = text[len(scheme) + 1 :]
    if not rest.startswith("//"):
        raise URLError("missing '//' after the scheme")
    rest = rest[2:].split("#", 1)[0]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    host, ip, port = parse_authority(rest[:cut])
    tail = rest[cut:]
    target = tail if tail.startswith("/") else "/" + tail
    return RemoteURL(scheme, host, ip, DEFAULT_PORTS[scheme] if port is None else port, target)


def join_location(base: RemoteURL, location: str) -> str:
    """A redirect's ``Location`` as an absolute URL text, to be parsed (and checked) again."""
    if url_scheme(location) is not None:
        return location
    if location.startswith("//"):
        return f"{base.scheme}:{location}"
    if location.startswith("/"):
        return base.origin + location
    path = base.target.split("?", 1)[0]
    if location.startswith("?"):
        return base.origin + path + location
    return base.origin + path.rsplit("/", 1)[0] + "/" + location
