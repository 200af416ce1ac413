"""Where the launcher keeps what it prepares once (the tritonserver work folder, the demo model, logs)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "TRITON_CHAT_CACHE"


def cache_root() -> Path:
    """``$TRITON_CHAT_CACHE``, else ``$XDG_CACHE_HOME/triton-chat``, else ``~/.cache/triton-chat``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "triton-chat"
