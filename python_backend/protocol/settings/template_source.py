"""Reading the ``chat_template`` setting's value, as vLLM reads ``--chat-template``.

Owns ``chat_template_text``: the value is a file's path, or else the template itself on one line
(its ``\\n`` escapes decoded). The launcher runs it to refuse a bad value before the model loads,
and the model to load the template; standard library only, so both may import it.
"""

from __future__ import annotations

import codecs
from pathlib import Path

# vLLM's rule: a value with none of these characters that is not a readable file is a mistyped
# path, not a template.
_TEMPLATE_CHARS = "{}\n"


class ChatTemplateError(ValueError):
    """The ``chat_template`` value is neither a readable file nor a template; the message says why."""


def chat_template_text(value: str) -> str:
    """The template ``value`` names: the file's text, or ``value`` itself with its escapes decoded."""
    path = Path(value).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        if not any(char in value for char in _TEMPLATE_CHARS):
            raise ChatTemplateError(f"'{value}' looks like a file's path but cannot be read: {exc}") from exc
        # A template on the command line carries its newlines as \n, as vLLM decodes them.
        # backslashreplace keeps characters outside Latin-1 through the decoding.
        return codecs.decode(value.encode("latin-1", "backslashreplace"), "unicode_escape")
    if not text.strip():
        raise ChatTemplateError(f"'{value}' is an empty file")
    return text
