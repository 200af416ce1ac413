"""The per-request byte budget shared by a request's concurrent media loads.

Owns: ``ByteBudget``. One is made per request (never shared between requests) and charged as
bytes arrive, so a request's media together stay under ``max_request_bytes`` even while several
downloads stream at once. Charged only from the event loop thread, so it needs no lock.
"""

from __future__ import annotations

from openai_frontend.media.errors import MediaError, MediaFailure


class ByteBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def charge(self, size: int) -> None:
        """Count ``size`` more bytes; raise ``MediaError`` (too large) past the limit."""
        self.used += size
        if self.used > self.limit:
            raise MediaError(
                MediaFailure.TOO_LARGE,
                f"request media reached {self.used} bytes, over {self.limit}",
                f"makes the request's media exceed the {self.limit}-byte total limit",
            )
