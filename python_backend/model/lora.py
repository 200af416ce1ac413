"""LoRA adapters: loaded once at start with ``peft``, chosen per request inside one batch.

Owns: parsing the ``lora_modules`` setting (MindIE's ``LoraModules``: name -> local adapter
folder), wrapping the base model in a ``PeftModel`` holding every adapter, and the per-row
``adapter_names`` that peft's mixed-batch inference takes, so requests for different adapters and
for the base model share one forward pass. ``peft`` is imported only when adapters are configured.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from python_backend.protocol.settings import SettingsError

logger = logging.getLogger(__name__)

BASE = "__base__"  # peft's name for "no adapter" in a mixed batch


def parse_lora_modules(text: str) -> dict[str, str]:
    """``lora_modules`` is a JSON object ``{"name": "/path/to/adapter", ...}`` or empty."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"lora_modules must be a JSON object of name -> folder: {exc.msg}") from exc
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise SettingsError("lora_modules must be a JSON object of name -> folder")
    for name, folder in value.items():
        if not name or name == BASE:
            raise SettingsError(f"lora_modules: '{name}' is not a usable adapter name")
        if not (Path(folder).expanduser() / "adapter_config.json").is_file():
            raise SettingsError(f"lora_modules: '{name}' -> '{folder}' is not a PEFT adapter folder")
    return value


def attach_adapters(model: PreTrainedModel, adapters: dict[str, str]) -> Any:
    """The model with every adapter loaded (a ``PeftModel``), or the model itself when none."""
    if not adapters:
        return model
    from peft import PeftModel

    names = list(adapters)
    first = names[0]
    wrapped = PeftModel.from_pretrained(model, str(Path(adapters[first]).expanduser()), adapter_name=first)
    for name in names[1:]:
        wrapped.load_adapter(str(Path(adapters[name]).expanduser()), adapter_name=name)
    wrapped.eval()
    logger.info("loaded LoRA adapters: %s", ", ".join(names))
    return wrapped


def adapter_names(rows: list[str | None]) -> list[str]:
    """peft's per-row adapter list: an adapter's name, or the base model."""
    return [name or BASE for name in rows]
