"""The five content-part formats, read into ``MediaRef``s, and the ``messages`` the backend receives.

Owns: ``MediaRef`` (what to load for one part: its source, declared type and size cap),
``extract_media`` (all media parts of a request, checked for syntax and policy without any I/O,
and the messages rewritten to internal parts ``{"type": "image"|"video"|"audio", "media_index": i}``).

The formats (docs/api.md, media parts), for ``image_url`` / ``video_url`` / ``audio_url``:

1. ``"<str>"`` and 2. ``{"url": "<str>"}``: an http(s) URL, a ``file://`` or ``data:`` URL, a
   path below the media root, or (images only) raw base64 JPEG, recognised by its ``/9j/`` start
   (the base64 of the JPEG magic; a path starting so would lie outside the root anyway);
3. ``{"url": "file://<path>"}``: a path below the media root (``file://demo.png`` is
   ``<root>/demo.png``, as in MindIE's example; ``file:///<root>/demo.png`` works too);
4. ``{"url": "data:<mime>;base64,<b64>"}``: inline, the MIME type must be a format of the part's kind;
5. ``{"type": "input_audio", "input_audio": {"data": "<b64>", "format": "mp3|wav|flac"}}``.

Any other ``scheme:`` prefix (``ftp:``, ``gopher:``, ``jar:``...) is refused, so a local file
name with a colon before its first ``/`` must be given as ``file://``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from openai_frontend.media.errors import MediaError, MediaFailure, too_large, too_many_media
from openai_frontend.media.formats import (
    JPEG,
    PART_KINDS,
    MediaFormat,
    MediaKind,
    format_for_audio_name,
    format_for_extension,
    format_for_mime,
)
from openai_frontend.media.local import local_components
from openai_frontend.media.policy import MediaSettings
from openai_frontend.media.urls import RemoteURL, URLError, parse_remote_url, url_scheme

RAW_JPEG_PREFIX = "/9j/"


@dataclass(frozen=True)
class RemoteSource:
    url: RemoteURL


@dataclass(frozen=True)
class LocalSource:
    components: tuple[str, ...]  # below the media root


@dataclass(frozen=True)
class InlineSource:
    base64: str


Source = RemoteSource | LocalSource | InlineSource
_Read = tuple[Source, MediaFormat | None, int]  # a part's source, declared format and size cap


@dataclass(frozen=True)
class MediaRef:
    """One media part to load."""

    param: str  # the part's field, for errors: "messages.0.content.1.image_url"
    kind: MediaKind
    source: Source
    declared: MediaFormat | None  # from a data: MIME type, an extension or input_audio.format
    cap: int  # bytes


@dataclass(frozen=True)
class MediaParts:
    messages: list[dict[str, Any]]  # media parts replaced by internal parts
    refs: tuple[MediaRef, ...]  # refs[i] is the item of media_index i


def _inline(payload: str, declared: MediaFormat | None, cap: int) -> _Read:
    # Checked on the text before decoding: base64 is 4 characters per 3 bytes.
    if len(payload) // 4 * 3 > cap + 2:
        raise too_large(cap, f"base64 of {len(payload)} characters")
    return InlineSource(payload), declared, cap


def _data_url(text: str, kind: MediaKind, settings: MediaSettings) -> _Read:
    header, comma, payload = text[len("data:") :].partition(",")
    params = header.split(";")
    if not comma or len(params) < 2 or params[-1].strip().lower() != "base64":
        raise MediaError(MediaFailure.INVALID_REFERENCE, "data: URL is not ';base64,'", "must be a base64 data: URL")
    fmt = format_for_mime(params[0])
    if fmt is None or fmt.kind != kind:
        raise MediaError(
            MediaFailure.INVALID_CONTENT,
            f"data: URL of type {params[0][:64]!r}",
            "has a media type that is not accepted",
        )
    return _inline(payload, fmt, settings.max_bytes(kind, inline=True))


def _remote(text: str, settings: MediaSettings) -> RemoteSource:
    try:
        url = parse_remote_url(text)
    except URLError as exc:
        failure = MediaFailure.NOT_ALLOWED if exc.scheme_refused else MediaFailure.INVALID_REFERENCE
        raise MediaError(failure, f"URL refused: {exc}") from exc
    if not settings.allows(url):
        raise MediaError(MediaFailure.NOT_ALLOWED, f"{url.host_header} is not on the allow-list")
    return RemoteSource(url)


def _reference(text: str, kind: MediaKind, settings: MediaSettings) -> _Read:
    cap = settings.max_bytes(kind, inline=False)
    scheme = url_scheme(text)
    if scheme == "data":
        return _data_url(text, kind, settings)
    if scheme in ("http", "https"):
        remote = _remote(text, settings)
        return remote, format_for_extension(remote.url.file_name), cap
    if scheme == "file":
        if not text[len("file:") :].startswith("//"):
            raise MediaError(MediaFailure.INVALID_REFERENCE, "file: URL without '//'")
        text = text[len("file://") :]
    elif scheme is not None:
        raise MediaError(MediaFailure.NOT_ALLOWED, f"scheme {scheme[:32]!r} refused")
    elif kind == "image" and text.startswith(RAW_JPEG_PREFIX):
        return _inline(text, JPEG, settings.max_bytes(kind, inline=True))
    components = local_components(text, settings.media_root)
    return LocalSource(components), format_for_extension(components[-1]), cap


def _read_part(value: Any, part_type: str, settings: MediaSettings) -> _Read:
    kind = PART_KINDS[part_type]
    if part_type == "input_audio":
        data = value.get("data") if isinstance(value, dict) else None
        name = value.get("format") if isinstance(value, dict) else None
        if not isinstance(data, str) or not data or not isinstance(name, str):
            raise MediaError(MediaFailure.INVALID_REFERENCE, "input_audio shape", "needs string 'data' and 'format'")
        fmt = format_for_audio_name(name)
        if fmt is None:
            raise MediaError(MediaFailure.INVALID_REFERENCE, "input_audio format", "'format' must be mp3, wav or flac")
        return _inline(data, fmt, settings.max_bytes(kind, inline=True))
    text = value.get("url") if isinstance(value, dict) else value
    if not isinstance(text, str) or not text:
        raise MediaError(
            MediaFailure.INVALID_REFERENCE, "not a string or {'url': string}", "must be a string or {'url': string}"
        )
    return _reference(text, kind, settings)


def _count_media(messages: Sequence[dict[str, Any]]) -> int:
    return sum(
        1
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") in PART_KINDS
    )


def extract_media(messages: list[dict[str, Any]], settings: MediaSettings) -> MediaParts:
    """Read every media part of validated ``messages``; raise ``ContractError`` naming the first bad one."""
    if _count_media(messages) > settings.max_items:
        raise too_many_media(settings.max_items)
    refs: list[MediaRef] = []
    rewritten: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list) or not any(part.get("type") in PART_KINDS for part in content):
            rewritten.append(message)
            continue
        parts: list[dict[str, Any]] = []
        for k, part in enumerate(content):
            part_type = part.get("type")
            if part_type not in PART_KINDS:
                parts.append(part)
                continue
            param = f"messages.{i}.content.{k}.{part_type}"
            try:
                source, declared, cap = _read_part(part[part_type], part_type, settings)
            except MediaError as exc:
                raise exc.to_contract_error(param) from exc
            kind = PART_KINDS[part_type]
            parts.append({"type": kind, "media_index": len(refs)})
            refs.append(MediaRef(param, kind, source, declared, cap))
        rewritten.append({**message, "content": parts})
    return MediaParts(rewritten, tuple(refs))
