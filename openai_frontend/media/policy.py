"""Media settings and the host rule: what may be fetched, how much, for how long, from where.

Owns: ``MediaSettings`` (frozen pydantic, part of ``FrontendSettings``), ``MediaSettings.from_env``
(the only reader of ``ALLOWED_MEDIA_DOMAINS_ENV``, called by whoever builds the settings, never
at import), ``AllowedHost`` (one parsed allow-list entry) and ``MediaSettings.allows`` (the
exact-match host and port rule).

Rules (docs/media-security.md):

* allow-list entries are exact host names or IP addresses, optionally with ``:port``; matching is
  case-insensitive after removing one trailing dot; there are no wildcards or suffix matches;
* an entry without a port allows the scheme's default port only (80/443): other ports on an
  allowed host are other services (SSH, admin consoles);
* an empty allow-list refuses all remote media (fail closed, stricter than MindIE); ``*`` alone
  is the explicit opt-in to any host (default ports only);
* the address check (``addresses``) applies to allowed hosts too: an allowed name can resolve inward.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from openai_frontend.media.formats import MediaKind
from openai_frontend.media.urls import DEFAULT_PORTS, RemoteURL, URLError, parse_authority

ALLOWED_MEDIA_DOMAINS_ENV = "ALLOWED_MEDIA_DOMAINS_ENV"
ANY_HOST = "*"
MIB = 1024 * 1024


@dataclass(frozen=True)
class AllowedHost:
    host: str  # normalised like ``RemoteURL.host``
    port: int | None  # None: the scheme's default port only

    def matches(self, url: RemoteURL) -> bool:
        if self.host != url.host:
            return False
        return url.port == (self.port if self.port is not None else DEFAULT_PORTS[url.scheme])


def parse_allowed_host(entry: str) -> AllowedHost:
    """One allow-list entry (``host``, ``host:port``, ``1.2.3.4``, ``[::1]:8443``), normalised by
    the parser that reads request URLs, so both sides compare equal forms."""
    try:
        host, _, port = parse_authority(entry.strip())
    except URLError as exc:
        raise ValueError(f"allow-list entry {entry!r} is not a host or host:port") from exc
    return AllowedHost(host, port)


class MediaSettings(BaseModel):
    """How the frontend loads media parts. Defaults are the seed's numbers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allowed_domains: tuple[str, ...] = Field(
        default=(),
        description=f"hosts remote media may come from ({ALLOWED_MEDIA_DOMAINS_ENV}); empty = none; '*' = any",
    )
    allow_private_addresses: bool = Field(
        default=False,
        description="also dial private-use addresses (RFC 1918, CGNAT, ULA); loopback and link-local never",
    )
    follow_redirects: bool = Field(default=False, description="follow HTTP redirects (each hop re-checked)")
    max_redirects: int = Field(default=3, ge=0, le=3, description="redirect hops followed when enabled")
    max_image_bytes: int = Field(default=40 * MIB, gt=0)
    max_video_bytes: int = Field(default=512 * MIB, gt=0)
    max_audio_bytes: int = Field(default=40 * MIB, gt=0)
    max_base64_audio_bytes: int = Field(default=20 * MIB, gt=0, description="input_audio and data: audio, decoded")
    max_request_bytes: int = Field(default=1024 * MIB, gt=0, description="all media of one request together")
    max_items: int = Field(default=20, gt=0, description="media parts per request")
    max_image_pixels: int = Field(default=89_478_485, gt=0, description="width x height, read from the header")
    # Degenerate shapes crash some image processors inside the model (CVE-2026-22773: a 1x1
    # image); 200:1 is Qwen2-VL's own aspect-ratio limit, so such images fail here, cheaply.
    min_image_side: int = Field(default=2, ge=1, description="smallest accepted width and height")
    max_image_aspect_ratio: float = Field(default=200.0, ge=1, description="largest accepted long:short side ratio")
    max_audio_seconds: float = Field(default=3600.0, gt=0, description="duration declared in a WAV/FLAC header")
    connect_timeout_s: float = Field(default=5.0, gt=0)
    fetch_timeout_s: float = Field(default=60.0, gt=0, description="whole download of one item, retries included")
    fetch_retries: int = Field(default=1, ge=0, le=5, description="retries after a 5xx answer or a failed connect")
    retry_backoff_s: float = Field(default=0.5, ge=0, description="first retry delay; doubles each retry")
    media_root: str = Field(default="/data/multimodal_inputs/", description="local media files live under this")

    _hosts: tuple[AllowedHost, ...] = PrivateAttr(default=())

    def model_post_init(self, context: Any, /) -> None:
        self._hosts = tuple(parse_allowed_host(entry) for entry in self.allowed_domains if entry != ANY_HOST)

    @field_validator("allowed_domains")
    @classmethod
    def _check_entries(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        entries = tuple(entry.strip() for entry in value if entry.strip())
        if ANY_HOST in entries and len(entries) > 1:
            raise ValueError("'*' must be the only allow-list entry")
        for entry in entries:
            if entry != ANY_HOST:
                parse_allowed_host(entry)
        return entries

    @field_validator("media_root")
    @classmethod
    def _absolute_root(cls, value: str) -> str:
        if not value.startswith("/") or "\x00" in value:
            raise ValueError("media_root must be an absolute path")
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> MediaSettings:
        """Settings with the allow-list from ``ALLOWED_MEDIA_DOMAINS_ENV`` (comma-separated)."""
        domains = tuple(part for part in environ.get(ALLOWED_MEDIA_DOMAINS_ENV, "").split(","))
        return cls.model_validate({"allowed_domains": domains, **overrides})

    @property
    def allow_any_host(self) -> bool:
        """The explicit ``*`` opt-in."""
        return self.allowed_domains == (ANY_HOST,)

    def allows(self, url: RemoteURL) -> bool:
        """True when the allow-list admits this URL's host and port (addresses are checked later)."""
        if self.allow_any_host:
            return url.port == DEFAULT_PORTS[url.scheme]
        return any(host.matches(url) for host in self._hosts)

    def max_bytes(self, kind: MediaKind, *, inline: bool) -> int:
        """The size cap of one item: by kind, and the base64 cap for inline audio."""
        if kind == "image":
            return self.max_image_bytes
        if kind == "video":
            return self.max_video_bytes
        return self.max_base64_audio_bytes if inline else self.max_audio_bytes
