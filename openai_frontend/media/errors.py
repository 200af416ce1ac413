"""Media errors and the one way they reach the client.

Owns: ``MediaFailure`` (the fixed vocabulary of what can go wrong), ``MediaError`` (raised anywhere
in the media package, carrying a public message built from fixed templates and an internal
``detail`` for the log only) and its conversion to the 400 envelope naming the content part.

Why a fixed vocabulary: error bodies must never carry an internal path, a resolved address, a
library's exception text or the origin's answer (A6; the CVE-2026-22778 lesson). So the public
text is chosen here, and whatever explains the failure goes to ``detail``, which is only logged.
All SSRF refusals (scheme, host, port, address, redirect) share one message, so that the answer
does not tell a prober which check fired or what an internal name resolves to.
"""

from __future__ import annotations

import enum
import logging

from python_backend.protocol.errors import ContractError, invalid

logger = logging.getLogger(__name__)


class MediaFailure(enum.Enum):
    """What went wrong, as ``(code, default public text)``; the text follows the part's name."""

    INVALID_REFERENCE = ("invalid_media_reference", "is not a valid media reference")
    NOT_ALLOWED = ("media_not_allowed", "names a media source that is not allowed")
    UNAVAILABLE = ("media_unavailable", "names a media file that is not available")
    FETCH_FAILED = ("media_fetch_failed", "could not be fetched")
    TIMEOUT = ("media_timeout", "could not be fetched in time")
    TOO_LARGE = ("media_too_large", "is larger than the size limit")
    INVALID_CONTENT = ("invalid_media", "is not a valid media file of a supported format")

    @property
    def code(self) -> str:
        return self.value[0]

    @property
    def text(self) -> str:
        return self.value[1]


class MediaError(Exception):
    """A media part that cannot be used.

    ``public`` replaces the default text and must be built only from constants and numbers (never
    from the request, the network or a library); ``detail`` is for the log.
    """

    def __init__(self, failure: MediaFailure, detail: str, public: str | None = None) -> None:
        super().__init__(detail)
        self.failure = failure
        self.detail = detail
        self.public = public or failure.text

    def to_contract_error(self, param: str) -> ContractError:
        """The 400 envelope naming ``param`` (``messages.0.content.1.image_url``); the detail is logged."""
        logger.info("media part %s refused (%s): %s", param, self.failure.code, self.detail)
        return invalid(f"'{param}' {self.public}", param, self.failure.code)


def too_many_media(limit: int) -> ContractError:
    return invalid(f"a request may carry at most {limit} media items", "messages", "too_many_media")


def too_large(cap: int, detail: str) -> MediaError:
    """The one "over the size cap" error, naming the cap (a setting, not a secret)."""
    return MediaError(MediaFailure.TOO_LARGE, detail, f"is larger than the {cap}-byte limit")
