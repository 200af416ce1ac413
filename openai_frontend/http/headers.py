"""Response headers built from request data: only safe bytes, bounded in size.

Owns: ``ignored_params_headers``, the ``x-ignored-params`` header that names the unknown body
fields a request carried. A field name is the client's text: it may hold characters outside
Latin-1, control characters, CR/LF, NUL or DEL, any of which would make the server fail to send
the response (or split it). Each name is therefore percent-encoded as UTF-8 outside visible ASCII
(``%`` and the list separator ``,`` included), so ``caf%C3%A9`` reads back with any URL decoder,
and the list stops at ``MAX_IGNORED_HEADER_BYTES``: the names left out are counted in
``x-ignored-params-dropped``.
"""

from __future__ import annotations

IGNORED_PARAMS_HEADER = "x-ignored-params"
IGNORED_DROPPED_HEADER = "x-ignored-params-dropped"
# Far below any proxy's or client's header limit (commonly 8 KiB for one line).
MAX_IGNORED_HEADER_BYTES = 2048

_VISIBLE = frozenset(range(0x21, 0x7F)) - {ord("%"), ord(",")}


def header_safe(text: str) -> str:
    """``text`` percent-encoded (as UTF-8) outside visible ASCII, ``%`` and ``,``."""
    if text.isascii() and all(ord(char) in _VISIBLE for char in text):
        return text
    return "".join(chr(byte) if byte in _VISIBLE else f"%{byte:02X}" for byte in text.encode("utf-8"))


def ignored_params_headers(names: tuple[str, ...] | list[str]) -> dict[str, str]:
    """The headers naming ``names`` (none when empty), escaped and capped in size."""
    kept: list[str] = []
    size = 0
    for name in names:
        safe = header_safe(name)
        if size + len(safe) + (1 if kept else 0) > MAX_IGNORED_HEADER_BYTES:
            break
        kept.append(safe)
        size += len(safe) + (1 if len(kept) > 1 else 0)
    headers: dict[str, str] = {}
    if kept:
        headers[IGNORED_PARAMS_HEADER] = ",".join(kept)
    if len(kept) < len(names):
        headers[IGNORED_DROPPED_HEADER] = str(len(names) - len(kept))
    return headers
