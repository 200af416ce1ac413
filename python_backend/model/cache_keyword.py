"""The keyword a transformers model's forward takes its KV cache under.

Owns ``cache_keyword``: transformers 5 renamed ``past_key_values`` to ``cache``; the engine (for
the model) and the draft loader (for the draft) pass whichever the installed version takes.
"""

from __future__ import annotations

import inspect
from typing import Any


def cache_keyword(model: Any) -> str:
    """``"cache"`` where ``model.forward`` takes it, else ``"past_key_values"``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
