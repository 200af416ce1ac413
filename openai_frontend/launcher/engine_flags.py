"""The ``serve`` command's engine flags, generated from ``EngineSettings``' field metadata.

Owns: declaring one flag per ``EngineSettings`` field that has a ``SettingInfo.flag``, with its
``aliases`` and ``bytes_flag`` and its default in its help (``add_engine_flags``), vLLM's
``--speculative-config`` beside the speculative settings, and reading them back
(``engine_values``), so a new setting needs only its field and ``SettingInfo`` in
``python_backend/protocol/settings/``. Each flag's ``dest`` is its field's name.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import Field, dataclass, fields
from pathlib import Path
from typing import Any

from openai_frontend.launcher.http_flags import non_negative_int, with_default
from openai_frontend.launcher.speculative_config import (
    SPECULATIVE_CONFIG_HELP,
    SPECULATIVE_FIELDS,
    speculative_config,
)
from openai_frontend.launcher.template_flags import FLAG_TYPES
from python_backend.protocol.settings import (
    LIMITS_GROUP,
    EngineSettings,
    SettingInfo,
    setting_info,
    setting_kind,
)

# Fields the launcher resolves itself: unset means the demo model, the folder's name, no adapters.
MODEL_DIR = "model_path"
SERVED_NAME = "served_model_name"
LORA_MODULES = "lora_modules"
MIB = 1024 * 1024
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)(?:i?B)?")
# vLLM's human-readable sizes: lower case decimal (1k = 1000), upper case binary (1K = 1024).
_SIZE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclass(frozen=True)
class EngineValues:
    """The engine flags of one ``serve`` command line, split as ``ServeOptions`` keeps them."""

    overrides: dict[str, int]  # integer settings given (on the command line or in --config)
    flags: dict[str, str | bool]  # the other settings with a flag, at their given or default value


def flagged_fields() -> list[tuple[Field[Any], SettingInfo]]:
    """The ``EngineSettings`` fields that are ``serve`` flags, in declaration order."""
    return [(spec, setting_info(spec)) for spec in fields(EngineSettings) if setting_info(spec).flag]


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def size_in_mib(text: str) -> int:
    """An argparse type: a size in bytes as vLLM writes it (``4294967296``, ``4G``, ``4GiB``,
    ``1.5g``), as the whole MiB that hold it (0 stays 0: automatic)."""
    found = _SIZE.fullmatch(text.strip())
    if found is None:
        raise argparse.ArgumentTypeError(f"not a size in bytes (e.g. 4294967296, 4G, 512M): '{text}'")
    size = float(found.group(1)) * _SIZE_UNITS[found.group(2)]
    return math.ceil(size / MIB)


class _Switch(argparse.BooleanOptionalAction):
    """``--X`` / ``--no-X`` with the help as given (3.10-3.13 would add a second "(default: ...)")."""

    def __init__(self, *args: Any, help: str | None = None, **kwargs: Any) -> None:  # noqa: A002
        super().__init__(*args, **kwargs)
        self.help = help


def _shown_default(spec: Field[Any], info: SettingInfo) -> str:
    """The default as ``--help`` says it."""
    if isinstance(spec.default, bool):
        # A --no-X flag's help says what turning the setting off does.
        return f"unset, {spec.name} on" if str(info.flag).startswith("--no-") else ("on" if spec.default else "off")
    if spec.default == "":
        return info.docs_default.replace("`", "") or "none"
    return str(spec.default)


def _flag_arguments(spec: Field[Any], info: SettingInfo) -> dict[str, Any]:
    kind = setting_kind(spec)
    arguments: dict[str, Any] = {"dest": spec.name, "help": with_default(info.help, _shown_default(spec, info))}
    if kind == "bool":
        # --no-X (a setting on by default) turns it off; a positive flag X also takes --no-X, as vLLM's.
        if str(info.flag).startswith("--no-"):
            arguments["action"] = "store_false"
        else:
            arguments.update(action=_Switch, default=spec.default)
        return arguments
    if info.metavar:
        arguments["metavar"] = info.metavar
    if kind == "int":
        # Unset stays None, so that only what was given becomes an override.
        arguments["type"] = positive_int if info.minimum == 1 else non_negative_int
    elif spec.name == MODEL_DIR:
        arguments["type"] = Path
    elif spec.name == LORA_MODULES:
        # vLLM's form: several after one flag (--lora-modules a=DIR b=DIR), or the flag repeated.
        arguments.update(action="extend", nargs="+", default=[])
    elif spec.name in FLAG_TYPES:
        arguments.update(type=FLAG_TYPES[spec.name], default=spec.default)
    elif spec.name != SERVED_NAME:
        arguments["default"] = spec.default
        if info.choices:
            arguments["choices"] = info.choices
    return arguments


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """One argument group per ``SettingInfo.group``, each with its settings' flags."""
    groups: dict[str, Any] = {}
    for spec, info in flagged_fields():
        if info.group not in groups:
            groups[info.group] = parser.add_argument_group(info.group)
        group = groups[info.group]
        group.add_argument(str(info.flag), *info.aliases, **_flag_arguments(spec, info))
        if info.bytes_flag:
            group.add_argument(
                info.bytes_flag,
                dest=spec.name,
                type=size_in_mib,
                metavar="BYTES",
                help=with_default(
                    f"{info.flag} in bytes, as vLLM's (4G = 4 GiB, 4g = 4e9; rounded up to whole MiB)",
                    _shown_default(spec, info),
                ),
            )
    groups[LIMITS_GROUP].add_argument(
        "--speculative-config", type=speculative_config, metavar="JSON", help=SPECULATIVE_CONFIG_HELP
    )


def engine_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> EngineValues:
    """The engine settings the parsed arguments set, except those the launcher resolves;
    ``--speculative-config`` beside a ``--speculative-*`` flag is a usage error."""
    overrides: dict[str, int] = {}
    flags: dict[str, str | bool] = {}
    for spec, _ in flagged_fields():
        if spec.name in (MODEL_DIR, SERVED_NAME, LORA_MODULES):
            continue
        value = _from_environment(parser, spec, getattr(args, spec.name))
        if setting_kind(spec) != "int":
            flags[spec.name] = value
        elif value is not None:
            overrides[spec.name] = value
    config: dict[str, int | str] | None = args.speculative_config
    if config is not None:
        given = [f"{setting_info(spec).flag}" for spec in fields(EngineSettings) if _given(spec, overrides, flags)]
        if given:
            parser.error(f"--speculative-config replaces {', '.join(given)}: give one or the other")
        for name, value in config.items():
            if isinstance(value, int):
                overrides[name] = value
            else:
                flags[name] = value
    return EngineValues(overrides, flags)


def _from_environment(parser: argparse.ArgumentParser, spec: Field[Any], value: Any) -> Any:
    """``value``, or where it was not given (None, or an empty text) the first of the setting's
    ``env`` variables that is set (torchrun's and its launchers' names, e.g. MASTER_ADDR)."""
    if value not in (None, ""):
        return value
    for name in setting_info(spec).env:
        text = os.environ.get(name, "")
        if not text:
            continue
        if setting_kind(spec) != "int":
            return text
        try:
            number = int(text)
        except ValueError:
            parser.error(f"{name}={text} (read for {setting_info(spec).flag}) must be an integer")
        return number
    return value


def _given(spec: Field[Any], overrides: dict[str, int], flags: dict[str, str | bool]) -> bool:
    if spec.name not in SPECULATIVE_FIELDS:
        return False
    if setting_kind(spec) == "int":
        return spec.name in overrides
    return flags.get(spec.name, spec.default) != spec.default
