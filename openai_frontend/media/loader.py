"""Loading one request's media: every part at once, each checked, all or nothing.

Owns: ``MediaLoader`` (one per app, built from ``MediaSettings`` and a ``Network``) and its
``load``: the ``MediaRef``s from ``parts.extract_media`` become ``(bytes, MIME type)`` pairs in
``media_index`` order, or the first failure becomes the 400 envelope naming its part.

Items load concurrently (one slow origin does not serialise the rest) under one per-request
``ByteBudget``; the first failure cancels the others, so a bad request does not keep downloading.
Blocking work (local file reads, base64 decoding, content checks) runs in worker threads so the
event loop, and every other request, keeps going.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Callable, Sequence

import anyio

from openai_frontend.media.budget import ByteBudget
from openai_frontend.media.errors import MediaError, MediaFailure, too_large
from openai_frontend.media.fetch import Fetched, RemoteFetcher
from openai_frontend.media.formats import MediaFormat, format_for_extension, format_for_mime
from openai_frontend.media.local import read_local_file
from openai_frontend.media.net import Network
from openai_frontend.media.parts import LocalSource, MediaRef, RemoteSource
from openai_frontend.media.policy import MediaSettings
from openai_frontend.media.sniff import check_content

LoadedMedia = tuple[bytes, str]  # raw bytes and canonical MIME type: ``BackendRequest.media`` items
FetchObserver = Callable[[str, int], None]  # (``ok`` or the failure's code, bytes): one per remote fetch


def _ignore(_result: str, _size: int) -> None:
    return None


def decode_base64(text: str, cap: int) -> bytes:
    """Strict base64 (no whitespace, no URL-safe alphabet) of at most ``cap`` decoded bytes."""
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MediaError(MediaFailure.INVALID_REFERENCE, f"base64: {exc}", "is not valid base64") from exc
    if len(data) > cap:
        raise too_large(cap, f"base64 decodes to {len(data)} bytes")
    return data


def _declared_by_origin(fetched: Fetched) -> list[MediaFormat]:
    # What the final URL's extension and a media Content-Type claim; generic types
    # (application/octet-stream, text/html) claim nothing and leave the verdict to the bytes.
    claims = [format_for_extension(fetched.url.file_name)]
    if fetched.content_type is not None:
        claims.append(format_for_mime(fetched.content_type))
    return [fmt for fmt in claims if fmt is not None]


class MediaLoader:
    """Loads media parts under one ``MediaSettings``."""

    def __init__(
        self, settings: MediaSettings, network: Network | None = None, on_fetch: FetchObserver = _ignore
    ) -> None:
        self._settings = settings
        self._fetcher = RemoteFetcher(settings, network if network is not None else Network())
        self._on_fetch = on_fetch  # the frontend's metrics (media_fetch_total, media_fetch_bytes)

    async def load(self, refs: Sequence[MediaRef]) -> list[LoadedMedia]:
        """Every item of ``refs``, in order; ``ContractError`` (400) naming the first failed part."""
        budget = ByteBudget(self._settings.max_request_bytes)
        slots: dict[int, LoadedMedia] = {}
        failures: list[tuple[int, MediaError]] = []
        async with anyio.create_task_group() as group:

            async def run(index: int, ref: MediaRef) -> None:
                try:
                    slots[index] = await self._load_one(ref, budget)
                except MediaError as exc:
                    failures.append((index, exc))
                    group.cancel_scope.cancel()

            for index, ref in enumerate(refs):
                group.start_soon(run, index, ref)
        if failures:
            index, error = min(failures, key=lambda failure: failure[0])
            raise error.to_contract_error(refs[index].param) from error
        return [slots[index] for index in range(len(refs))]

    async def _load_one(self, ref: MediaRef, budget: ByteBudget) -> LoadedMedia:
        declared = [ref.declared] if ref.declared is not None else []
        source = ref.source
        if isinstance(source, RemoteSource):
            try:
                fetched = await self._fetcher.fetch(source.url, ref.cap, budget)  # charges while streaming
            except MediaError as exc:
                self._on_fetch(exc.failure.code, 0)
                raise
            data = fetched.data
            self._on_fetch("ok", len(data))
            declared += _declared_by_origin(fetched)
        else:
            if isinstance(source, LocalSource):
                read = functools.partial(read_local_file, source.components, self._settings.media_root, ref.cap)
            else:
                read = functools.partial(decode_base64, source.base64, ref.cap)
            data = await anyio.to_thread.run_sync(read)
            budget.charge(len(data))
        fmt = await anyio.to_thread.run_sync(check_content, data, ref.kind, declared, self._settings)
        return data, fmt.mime
