"""The tokenizer and chat template a model serves with.

Owns ``load_tokenizer``: the tokenizer of the ``tokenizer`` setting's folder (vLLM's
``--tokenizer``), else the model folder's; its chat template, else one only the folders'
``chat_template.json`` holds (vision/audio checkpoints keep it with the processor); and the
``chat_template`` setting (vLLM's ``--chat-template``) over both. A template that cannot be read or
does not compile is a ``ModelLoadError`` naming the setting, before any weight is read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from python_backend.protocol.settings import EngineSettings
from python_backend.protocol.settings.template_source import ChatTemplateError, chat_template_text


class TokenizerError(RuntimeError):
    """The tokenizer or the chat template cannot be used; the message names the setting."""


def _processor_template(folder: Path) -> str | None:
    try:
        data: Any = json.loads((folder / "chat_template.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # absent or unreadable: the tokenizer's own template is the only one
    template = data.get("chat_template") if isinstance(data, dict) else None
    return template if isinstance(template, str) and template else None


def compile_check(template: str) -> None:
    """Raise jinja2's ``TemplateError`` when ``template`` does not compile (as transformers compiles it)."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    environment.parse(template)


def load_tokenizer(settings: EngineSettings, model_folder: Path) -> PreTrainedTokenizerBase:
    """The tokenizer the model serves with, its ``chat_template`` set (see the module's docstring)."""
    source = Path(settings.tokenizer).expanduser() if settings.tokenizer else model_folder
    if settings.tokenizer and not source.is_dir():
        raise TokenizerError(f"tokenizer (--tokenizer) '{settings.tokenizer}' is not a folder")
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(source), local_files_only=True, trust_remote_code=settings.trust_remote_code
        )
    except (OSError, ValueError) as exc:
        if not settings.tokenizer:
            raise
        raise TokenizerError(f"tokenizer (--tokenizer) '{settings.tokenizer}' cannot be loaded: {exc}") from exc
    if settings.chat_template:
        try:
            template = chat_template_text(settings.chat_template)
            compile_check(template)
        except (ChatTemplateError, TemplateError) as exc:
            raise TokenizerError(f"chat_template (--chat-template): {exc}") from exc
        tokenizer.chat_template = template
        return tokenizer
    if not getattr(tokenizer, "chat_template", None):
        for folder in dict.fromkeys((source, model_folder)):
            processor_template = _processor_template(folder)
            if processor_template is not None:
                tokenizer.chat_template = processor_template
                break
    if not getattr(tokenizer, "chat_template", None):
        raise TokenizerError(
            "the tokenizer has no chat_template; a chat model needs tokenizer_config.json "
            "(or chat_template.jinja) to define one, or give one with --chat-template"
        )
    return tokenizer
