"""The argparse types of ``--chat-template`` and ``--tokenizer`` (vLLM's flags).

Owns ``chat_template_flag`` and ``tokenizer_flag``: a value the model could not use fails the
start as a usage error naming the flag, before tritonserver starts; a path becomes absolute,
as tritonserver's stub does not run in the launcher's working directory.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from jinja2 import TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from openai_frontend.launcher.model_check import TOKENIZER_FILES
from python_backend.protocol.settings.template_source import ChatTemplateError, chat_template_text


def chat_template_flag(value: str) -> str:
    """A template file (as its absolute path) or a one-line template that compiles; "" = none."""
    if not value:
        return value
    try:
        template = chat_template_text(value)
    except ChatTemplateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    # The same environment transformers renders chat templates in.
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    try:
        environment.parse(template)
    except TemplateSyntaxError as exc:
        raise argparse.ArgumentTypeError(f"the template does not compile: line {exc.lineno}: {exc.message}") from exc
    path = Path(value).expanduser()
    return str(path.resolve()) if path.is_file() else value


def tokenizer_flag(value: str) -> str:
    """A folder with a tokenizer, as its absolute path; "" = the model folder's."""
    if not value:
        return value
    path = Path(value).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"'{value}' is not a folder (a local tokenizer folder is needed)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise argparse.ArgumentTypeError(f"'{value}' has no tokenizer ({', '.join(TOKENIZER_FILES)})")
    return str(path.resolve())


FLAG_TYPES = {"chat_template": chat_template_flag, "tokenizer": tokenizer_flag}
