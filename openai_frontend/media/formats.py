"""The media formats the product accepts (docs/api.md, media parts).

Owns: ``MediaFormat`` and the tables that map a part type, a file extension or a declared MIME type
to a format. The canonical MIME type of each format is the one MindIE's API lists; a few common
aliases (``image/jpg``, ``audio/wav``, ...) are accepted on input and answered with the canonical
type, so the backend sees one spelling per format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MediaKind = Literal["image", "video", "audio"]

# Content-part type -> the kind of media it carries.
PART_KINDS: dict[str, MediaKind] = {
    "image_url": "image",
    "video_url": "video",
    "audio_url": "audio",
    "input_audio": "audio",
}


@dataclass(frozen=True)
class MediaFormat:
    name: str  # "jpeg", "png", ...
    kind: MediaKind
    mime: str  # canonical MIME type, the one sent to the backend
    extensions: tuple[str, ...]
    aliases: tuple[str, ...] = ()  # other MIME spellings accepted on input


JPEG = MediaFormat("jpeg", "image", "image/jpeg", ("jpg", "jpeg"), ("image/jpg", "image/pjpeg"))
PNG = MediaFormat("png", "image", "image/png", ("png",))
MP4 = MediaFormat("mp4", "video", "video/mp4", ("mp4",))
AVI = MediaFormat("avi", "video", "video/x-msvideo", ("avi",), ("video/avi", "video/msvideo"))
WMV = MediaFormat("wmv", "video", "video/x-ms-wmv", ("wmv",))
MP3 = MediaFormat("mp3", "audio", "audio/mpeg", ("mp3",), ("audio/mp3", "audio/mpeg3"))
WAV = MediaFormat("wav", "audio", "audio/x-wav", ("wav",), ("audio/wav", "audio/wave", "audio/vnd.wave"))
FLAC = MediaFormat("flac", "audio", "audio/flac", ("flac",), ("audio/x-flac",))

ALL_FORMATS = (JPEG, PNG, MP4, AVI, WMV, MP3, WAV, FLAC)

_BY_EXTENSION = {ext: fmt for fmt in ALL_FORMATS for ext in fmt.extensions}
_BY_MIME = {mime: fmt for fmt in ALL_FORMATS for mime in (fmt.mime, *fmt.aliases)}


def format_for_extension(name: str) -> MediaFormat | None:
    """The format a file name's extension declares (case-insensitive), or None."""
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        return None
    return _BY_EXTENSION.get(ext.lower())


def format_for_mime(mime: str) -> MediaFormat | None:
    """The format a MIME type names (parameters and case ignored), or None."""
    return _BY_MIME.get(mime.split(";", 1)[0].strip().lower())


def format_for_audio_name(name: str) -> MediaFormat | None:
    """``input_audio.format`` (``mp3``/``wav``/``flac``, any case) -> its format."""
    fmt = _BY_EXTENSION.get(name.lower())
    return fmt if fmt is not None and fmt.kind == "audio" else None
