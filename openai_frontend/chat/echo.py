"""vLLM's chat ``echo``: the final assistant message's text put in front of every choice's reply.

Owns: ``with_echo``, which wraps a backend stream so that the first delta of each choice starts
with the echoed text. Whole answers, MindIE's cumulative ``full_text`` and streams all read the
same deltas, so the text appears once in each, in both API modes. Token counts are unchanged:
the echo is prompt text, not generated text.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import replace

from openai_frontend.client.base import close_stream
from python_backend.protocol.contract import ChoiceDelta


def with_echo(stream: AsyncGenerator[ChoiceDelta, None], echo: str) -> AsyncGenerator[ChoiceDelta, None]:
    """``stream`` itself when there is nothing to echo, else its deltas with the echo in front."""
    return _prepend(stream, echo) if echo else stream


async def _prepend(stream: AsyncGenerator[ChoiceDelta, None], echo: str) -> AsyncGenerator[ChoiceDelta, None]:
    started: set[int] = set()
    try:
        async for delta in stream:
            if delta.index not in started:
                started.add(delta.index)
                delta = replace(delta, text=echo + delta.text)
            yield delta
    finally:
        # Closing this wrapper early must close (and so cancel) the backend request too.
        await close_stream(stream)
