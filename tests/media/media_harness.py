"""Helpers to push one media part through the real path (message validation, ``extract_media``,
``MediaLoader``) and to check refusals: a 400 naming the part, in words that leak nothing (A6)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from openai_frontend.media.loader import LoadedMedia, MediaLoader
from openai_frontend.media.net import Network
from openai_frontend.media.parts import extract_media
from openai_frontend.media.policy import MediaSettings
from python_backend.protocol.errors import ContractError, ErrorInfo
from python_backend.protocol.messages import validate_messages

ALLOWED = (
    "allowed.test",
    "cdn.allowed.test",
    "mixed.allowed.test",
    "mixedv6.allowed.test",
    "inward.allowed.test",
    "private.allowed.test",
    "metadata.allowed.test",
    "v6inward.allowed.test",
    "mapped.allowed.test",
    "127.0.0.1.nip.test",
    "127.0.0.5.nip.test",
    "169.254.169.254.nip.test",
    "127-0-0-2.sslip.test",
    "10-0-0-1.sslip.test",
)

# A6: tracebacks, memory addresses, IP addresses, paths, library and errno names, echoed host names.
LEAK = re.compile(
    r"Traceback|File \"|0x[0-9a-fA-F]{6,}|\b\d{1,3}(\.\d{1,3}){3}\b|[0-9a-fA-F]*:[0-9a-fA-F]*:[0-9a-fA-F:]*"
    r"|/(tmp|data|dev|etc|proc|home|root|usr|work)\b|PIL|Pillow|h11|[Ee]rrno|\bE[A-Z]{4,}\b|Error|Exception"
    r"|\.test\b|nip|sslip|http|file:|data:"
)


def media_settings(root: Path | str = "/nonexistent/multimodal_inputs", **overrides: Any) -> MediaSettings:
    values: dict[str, Any] = {
        "allowed_domains": ALLOWED,
        "media_root": str(root),
        "connect_timeout_s": 1.0,
        "fetch_timeout_s": 5.0,
        "retry_backoff_s": 0.01,
    }
    values.update(overrides)
    return MediaSettings(**values)


def messages_with(value: Any, part_type: str = "image_url") -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": part_type, part_type: value}]}]


async def load(
    settings: MediaSettings, network: Network, value: Any, part_type: str = "image_url"
) -> list[LoadedMedia]:
    parsed = extract_media(validate_messages(messages_with(value, part_type)), settings)
    return await MediaLoader(settings, network).load(parsed.refs)


def assert_clean(info: ErrorInfo, param: str = "messages.0.content.1.image_url") -> None:
    assert info.status == 400 and info.type == "invalid_request_error"
    assert info.param == param
    prefix = f"'{param}' " if param.startswith("messages.0.content") else ""
    assert info.message.startswith(prefix), info.message
    rest = info.message[len(prefix) :]
    assert not LEAK.search(rest), info.message


async def refusal(settings: MediaSettings, network: Network, value: Any, part_type: str = "image_url") -> ErrorInfo:
    """The error a part is refused with (asserts it is a clean 400 naming the part)."""
    with pytest.raises(ContractError) as caught:
        await load(settings, network, value, part_type)
    info = caught.value.info
    assert_clean(info, f"messages.0.content.1.{part_type}")
    return info
