"""The media of one request: the ``media`` / ``media_types`` tensors matched to message parts.

Owns: ``collect_media``, which walks the internal media parts (``{"type": "image",
"media_index": i}``) in prompt order, checks each index against the tensors, and decodes the
bytes with the model's limits. Errors name the part (``messages.0.content.1``).
"""

from __future__ import annotations

from typing import Any

from python_backend.prompt.multimodal.media_decode import decode_media
from python_backend.prompt.multimodal.processor import MediaItem, MediaProcessor
from python_backend.protocol import contract
from python_backend.protocol.contract import TensorGetter
from python_backend.protocol.errors import invalid
from python_backend.protocol.messages import INTERNAL_MEDIA_TYPES


def media_parts(messages: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    """(kind, where, media_index) of every internal media part, in prompt order."""
    found = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for k, part in enumerate(content):
            kind = part.get("type")
            if kind in INTERNAL_MEDIA_TYPES:
                found.append((str(kind), f"messages.{i}.content.{k}", int(part["media_index"])))
    return found


def _as_bytes(item: Any) -> bytes:
    return item if isinstance(item, bytes) else str(item).encode("utf-8")


def collect_media(messages: list[dict[str, Any]], get: TensorGetter, processor: MediaProcessor) -> list[MediaItem]:
    """Decode every media item the messages reference; raise ``ContractError`` on any problem."""
    parts = media_parts(messages)
    if not parts:
        return []
    if len(parts) > processor.limits.max_items:
        raise invalid(
            f"the request has {len(parts)} media parts; the limit is {processor.limits.max_items}", "messages"
        )
    media = get(contract.MEDIA)
    types = get(contract.MEDIA_TYPES)
    blobs = [] if media is None else [_as_bytes(x) for x in media.reshape(-1)]
    mimes = [] if types is None else [_as_bytes(x).decode("utf-8", "replace") for x in types.reshape(-1)]
    if len(blobs) != len(mimes):
        raise invalid(
            f"'{contract.MEDIA}' has {len(blobs)} items but '{contract.MEDIA_TYPES}' has {len(mimes)}",
            contract.MEDIA_TYPES,
        )
    items = []
    for kind, where, index in parts:
        if kind not in processor.kinds:
            raise invalid(f"this model does not accept {kind} input; '{where}' is of type '{kind}'", f"{where}.type")
        if not 0 <= index < len(blobs):
            raise invalid(
                f"'{where}.media_index' is {index}; the request carries {len(blobs)} media items",
                f"{where}.media_index",
            )
        value = decode_media(
            kind, blobs[index], mimes[index].strip().lower(), where, processor.limits, processor.sampling_rate
        )
        items.append(MediaItem(kind, where, value))
    return items
