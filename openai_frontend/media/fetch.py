"""HTTP(S) media downloads: the one place that opens network connections for user URLs.

Owns: ``RemoteFetcher.fetch`` and what it returns (``Fetched``). Per hop, in this order:

1. the host and port must be on the allow-list (``MediaSettings.allows``);
2. the host is resolved once through the injectable resolver (an IP literal is not resolved);
3. every resolved address must pass ``address_allowed``: one refused address refuses the hop
   (a name answering "public, private" is not half-trusted);
4. the dialer connects to a checked *address*; the ``Host`` header and the TLS server name keep
   the name, so DNS cannot be asked again between check and use (rebinding);
5. one ``GET`` with ``Accept-Encoding: identity`` over HTTP/1.1 (h11, no connection reuse);
   ``Content-Length`` over the cap is refused before the body, the body is counted while it is
   read (chunked, lying lengths, endless streams), any ``Content-Encoding`` is refused (so nothing
   is ever inflated), and redirects are followed only when enabled, at most ``max_redirects``
   hops, each hop starting again at 1.

The whole item, redirects and retries included, runs under ``fetch_timeout_s``; each connect
under ``connect_timeout_s``. A 5xx answer or a failed connect is retried ``fetch_retries`` times
with doubling back-off against the same checked addresses (no new lookup); a 4xx is final.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import h11

from openai_frontend.media.addresses import IPAddress, address_allowed
from openai_frontend.media.budget import ByteBudget
from openai_frontend.media.errors import MediaError, MediaFailure, too_large
from openai_frontend.media.net import READ_CHUNK, Connection, Network
from openai_frontend.media.policy import MediaSettings
from openai_frontend.media.urls import RemoteURL, URLError, join_location, parse_remote_url

logger = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024  # status line plus headers of the origin's answer
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
USER_AGENT = "triton-chat-media/1"


@dataclass(frozen=True)
class Fetched:
    data: bytes
    content_type: str | None  # the origin's Content-Type, as sent
    url: RemoteURL  # the URL the body came from (after redirects)


class _Retryable(Exception):
    """A failure worth another try: a failed connect or a 5xx answer."""


async def _next_event(conn: h11.Connection, sock: Connection) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await sock.read(READ_CHUNK))


def _header(response: h11.Response, name: bytes) -> list[str]:
    return [value.decode("latin-1").strip() for key, value in response.headers if key == name]


class RemoteFetcher:
    """Downloads one URL under ``settings`` through ``network``."""

    def __init__(self, settings: MediaSettings, network: Network) -> None:
        self._settings = settings
        self._network = network

    async def fetch(self, url: RemoteURL, cap: int, budget: ByteBudget) -> Fetched:
        """The body of ``url`` (at most ``cap`` bytes), or ``MediaError``."""
        try:
            with anyio.fail_after(self._settings.fetch_timeout_s):
                return await self._follow(url, cap, budget)
        except TimeoutError as exc:
            raise MediaError(
                MediaFailure.TIMEOUT, f"{url} not fetched within {self._settings.fetch_timeout_s} s"
            ) from exc

    async def _follow(self, url: RemoteURL, cap: int, budget: ByteBudget) -> Fetched:
        redirects_left = self._settings.max_redirects if self._settings.follow_redirects else 0
        while True:
            result = await self._hop(url, cap, budget)
            if isinstance(result, Fetched):
                return result
            if redirects_left == 0:
                raise MediaError(MediaFailure.FETCH_FAILED, f"{url} redirects; not followed (limit or setting)")
            redirects_left -= 1
            try:
                url = parse_remote_url(join_location(url, result))
            except URLError as exc:
                raise MediaError(MediaFailure.NOT_ALLOWED, f"{url} redirects to a refused URL: {exc}") from exc

    async def _hop(self, url: RemoteURL, cap: int, budget: ByteBudget) -> Fetched | str:
        if not self._settings.allows(url):
            raise MediaError(MediaFailure.NOT_ALLOWED, f"{url.host_header} is not on the allow-list")
        addresses = await self._checked_addresses(url)
        attempts = self._settings.fetch_retries + 1
        last = _Retryable("not attempted")
        for attempt in range(attempts):
            if attempt:
                await anyio.sleep(self._settings.retry_backoff_s * 2 ** (attempt - 1))
            try:
                return await self._attempt(url, addresses, cap, budget)
            except _Retryable as exc:
                logger.info("media fetch attempt %d/%d failed: %s", attempt + 1, attempts, exc)
                last = exc
        raise MediaError(MediaFailure.FETCH_FAILED, f"{url}: {last}") from last

    async def _checked_addresses(self, url: RemoteURL) -> Sequence[IPAddress]:
        if url.ip is not None:
            addresses: Sequence[IPAddress] = (url.ip,)
        else:
            try:
                addresses = tuple(await self._network.resolver(url.host))
            except OSError as exc:
                raise MediaError(MediaFailure.FETCH_FAILED, f"cannot resolve {url.host}: {exc}") from exc
        if not addresses:
            raise MediaError(MediaFailure.FETCH_FAILED, f"{url.host} has no address")
        refused = [
            str(ip) for ip in addresses if not address_allowed(ip, allow_private=self._settings.allow_private_addresses)
        ]
        if refused:
            raise MediaError(MediaFailure.NOT_ALLOWED, f"{url.host} resolves to refused address(es) {refused}")
        return addresses

    async def _connect(self, url: RemoteURL, addresses: Sequence[IPAddress]) -> Connection:
        tls = self._network.tls if url.scheme == "https" else None
        failures = []
        for ip in addresses:
            try:
                with anyio.fail_after(self._settings.connect_timeout_s):
                    return await self._network.dialer(ip, url.port, tls=tls, server_name=url.host)
            except OSError as exc:  # includes TimeoutError and ssl.SSLError
                failures.append(f"{ip}: {type(exc).__name__} {exc}")
        raise _Retryable(f"connect to {url.host_header} failed: {failures}")

    async def _attempt(
        self, url: RemoteURL, addresses: Sequence[IPAddress], cap: int, budget: ByteBudget
    ) -> Fetched | str:
        sock = await self._connect(url, addresses)
        try:
            return await self._exchange(sock, url, cap, budget)
        except h11.RemoteProtocolError as exc:
            raise MediaError(MediaFailure.FETCH_FAILED, f"{url}: bad HTTP from origin: {exc}") from exc
        except OSError as exc:
            raise MediaError(MediaFailure.FETCH_FAILED, f"{url}: connection failed: {exc}") from exc
        finally:
            sock.close()

    async def _exchange(self, sock: Connection, url: RemoteURL, cap: int, budget: ByteBudget) -> Fetched | str:
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        headers = [
            ("Host", url.host_header),
            ("User-Agent", USER_AGENT),
            ("Accept", "*/*"),
            ("Accept-Encoding", "identity"),
            ("Connection", "close"),
        ]
        await sock.write(conn.send(h11.Request(method="GET", target=url.target, headers=headers)))
        await sock.write(conn.send(h11.EndOfMessage()))
        event = await _next_event(conn, sock)
        while isinstance(event, h11.InformationalResponse):
            event = await _next_event(conn, sock)
        if not isinstance(event, h11.Response):
            raise MediaError(MediaFailure.FETCH_FAILED, f"{url}: connection closed before an answer")
        status = event.status_code
        if status in REDIRECT_STATUSES:
            locations = _header(event, b"location")
            if len(locations) != 1 or not locations[0]:
                raise MediaError(MediaFailure.FETCH_FAILED, f"{url}: redirect {status} without one Location")
            return locations[0]
        if status >= 500:
            raise _Retryable(f"{url}: origin answered {status}")
        if status != 200:
            raise MediaError(MediaFailure.FETCH_FAILED, f"{url}: origin answered {status}")
        return await self._body(conn, sock, event, url, cap, budget)

    async def _body(
        self,
        conn: h11.Connection,
        sock: Connection,
        response: h11.Response,
        url: RemoteURL,
        cap: int,
        budget: ByteBudget,
    ) -> Fetched:
        encodings = [e for value in _header(response, b"content-encoding") for e in value.lower().split(",")]
        if any(e.strip() not in ("", "identity") for e in encodings):
            raise MediaError(
                MediaFailure.INVALID_CONTENT,
                f"{url}: Content-Encoding {encodings}",
                "was sent compressed, which is refused",
            )
        lengths = _header(response, b"content-length")
        if lengths and int(lengths[0]) > cap:  # h11 has checked it is one integer
            raise too_large(cap, f"{url}: Content-Length {lengths[0]} > {cap}")
        # A list of chunks rather than a growing bytearray: no over-allocation, so a refused
        # download peaks at the cap plus one read, not 1.125 x the cap.
        chunks: list[bytes] = []
        size = 0
        while True:
            event = await _next_event(conn, sock)
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > cap:
                    raise too_large(cap, f"{url}: body passed {cap} bytes")
                budget.charge(len(event.data))
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                types = _header(response, b"content-type")
                return Fetched(b"".join(chunks), types[0] if types else None, url)
            else:
                raise MediaError(MediaFailure.FETCH_FAILED, f"{url}: unexpected {type(event).__name__} in body")
