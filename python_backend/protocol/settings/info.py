"""What users are told about each engine setting, and the values settings may take.

Owns ``SettingInfo`` (the description declared beside each ``EngineSettings`` field, which the
launcher's flags, the ``config.json`` mapping and the configuration docs are generated from),
``setting`` (declares a field with its description), the readers ``setting_info`` and
``setting_kind``, and the choice lists and flag groups the fields refer to.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, field
from typing import Any

DTYPES = ("auto", "bfloat16", "float16", "float32")
# The tool-call formats the model can parse (python_backend.text.tool_parsers implements each).
HERMES = "hermes"
CHATGLM3 = "chatglm3"
LLAMA3_JSON = "llama3_json"
MISTRAL = "mistral"
TOOL_PARSERS = (HERMES, CHATGLM3, LLAMA3_JSON, MISTRAL)
TOOL_CALL_PARSER_CHOICES = ("auto", *TOOL_PARSERS, "none")
REASONING_PARSER_CHOICES = ("auto", "think", "none")
KV_CACHE_DTYPE_CHOICES = ("auto", "model", "bfloat16")
DEVICE_BASES = ("auto", "cpu", "cuda", "npu")

MODEL_GROUP = "model"
LIMITS_GROUP = "engine limits"
_INFO = "triton_chat"  # the key of a field's SettingInfo in its dataclasses metadata


@dataclass(frozen=True)
class SettingInfo:
    """What users are told about one setting, and where else it can be given."""

    help: str  # one line: the flag's --help text
    flag: str | None = None  # the `triton-chat serve` flag (vLLM's name where it has one); None: config.pbtxt only
    aliases: tuple[str, ...] = ()  # other names of the same flag (ours from before, vLLM's short ones)
    bytes_flag: str | None = None  # MB settings: a flag giving the same setting in bytes (vLLM's unit)
    mindie_key: str | None = None  # its key in MindIE's config.json ModelConfig, where one exists
    env: tuple[str, ...] = ()  # environment variables that give it when no flag does, first set wins
    choices: tuple[str, ...] = ()  # the valid values of a string setting; () = any (checked apart)
    minimum: int | None = None  # integers: the smallest valid value
    metavar: str | None = None  # the flag's value in --help
    group: str = MODEL_GROUP  # the --help section the flag is listed in
    docs: str = ""  # docs/configuration.md's meaning column; "" = the help text
    docs_default: str = ""  # the default as the docs say it; "" = the value itself


def setting(default: Any, info: SettingInfo) -> Any:
    """An ``EngineSettings`` field: its default, with ``info`` in its metadata."""
    return field(default=default, metadata={_INFO: info})


def setting_info(spec: Field[Any]) -> SettingInfo:
    """The ``SettingInfo`` declared beside an ``EngineSettings`` field."""
    info = spec.metadata.get(_INFO)
    if not isinstance(info, SettingInfo):
        raise TypeError(f"EngineSettings.{spec.name} has no SettingInfo")
    return info


def setting_kind(spec: Field[Any]) -> str:
    """``"bool"``, ``"int"`` or ``"str"``: the type of an ``EngineSettings`` field."""
    # `from __future__ import annotations` keeps the annotations as strings.
    return spec.type if isinstance(spec.type, str) else spec.type.__name__
