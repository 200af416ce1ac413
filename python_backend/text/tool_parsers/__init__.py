"""Tool-call parsers: turning a model's generated text into OpenAI ``tool_calls``.

Owns: the registry of formats (whose names, ``TOOL_PARSERS``, the settings in protocol hold) and ``make_tool_parser``. Each format lives in
its own module (``hermes``, ``chatglm3``, ``llama3_json``, ``mistral``); ``base`` holds the shared interface and the state-machine driver. Which format a
model uses is decided in ``python_backend.text.output_formats``.
"""

from __future__ import annotations

from python_backend.protocol.settings import CHATGLM3, HERMES, LLAMA3_JSON, MISTRAL, TOOL_PARSERS
from python_backend.text.tool_parsers.base import ParserOutput, ToolCall, ToolParser
from python_backend.text.tool_parsers.chatglm3 import ChatGLM3ToolParser
from python_backend.text.tool_parsers.hermes import HermesToolParser
from python_backend.text.tool_parsers.llama3_json import Llama3JsonToolParser
from python_backend.text.tool_parsers.mistral import MistralToolParser

__all__ = [
    "CHATGLM3",
    "HERMES",
    "LLAMA3_JSON",
    "MISTRAL",
    "TOOL_PARSERS",
    "ParserOutput",
    "ToolCall",
    "ToolParser",
    "make_tool_parser",
]


def make_tool_parser(name: str, tool_names: frozenset[str], prefill: str = "") -> ToolParser:
    """A fresh parser for one sequence; ``prefill`` is call text the prompt already ends with."""
    if name == HERMES:
        return HermesToolParser(prefill)
    if name == CHATGLM3:
        return ChatGLM3ToolParser(tool_names, prefill)
    if name == LLAMA3_JSON:
        return Llama3JsonToolParser(prefill)
    if name == MISTRAL:
        return MistralToolParser(prefill)
    raise ValueError(f"unknown tool-call parser '{name}' (known: {', '.join(TOOL_PARSERS)})")
