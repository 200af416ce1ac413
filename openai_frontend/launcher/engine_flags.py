"""The ``serve`` command's engine flags, generated from ``EngineSettings``' field metadata.

Owns: declaring one flag per ``EngineSettings`` field that has a ``SettingInfo.flag``
(``add_engine_flags``) and reading them back (``engine_values``), so a new setting needs only its
field and ``SettingInfo`` in ``python_backend/protocol/settings/``. Each flag's ``dest`` is its
field's name.
"""

from __future__ import annotations

import argparse
from dataclasses import Field, dataclass, fields
from pathlib import Path
from typing import Any

from openai_frontend.launcher.http_flags import non_negative_int
from python_backend.protocol.settings import EngineSettings, SettingInfo, setting_info, setting_kind

# Fields the launcher resolves itself: unset means the demo model, the folder's name, no adapters.
MODEL_DIR = "model_path"
SERVED_NAME = "served_model_name"
LORA_MODULES = "lora_modules"
GROUP_TITLES = {"model": "model", "engine limits": "engine limits (defaults: python_backend/protocol/settings/)"}


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


def _flag_arguments(spec: Field[Any], info: SettingInfo) -> dict[str, Any]:
    kind = setting_kind(spec)
    arguments: dict[str, Any] = {"dest": spec.name, "help": info.help}
    if kind == "bool":
        # A flag turns the setting away from its default: --no-X for those on by default.
        arguments["action"] = "store_false" if spec.default else "store_true"
        return arguments
    if info.metavar:
        arguments["metavar"] = info.metavar
    if kind == "int":
        # Unset stays None, so that only what was given becomes an override.
        arguments["type"] = positive_int if info.minimum == 1 else non_negative_int
    elif spec.name == MODEL_DIR:
        arguments["type"] = Path
    elif spec.name == LORA_MODULES:
        arguments.update(action="append", default=[])
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
            groups[info.group] = parser.add_argument_group(GROUP_TITLES.get(info.group, info.group))
        groups[info.group].add_argument(str(info.flag), **_flag_arguments(spec, info))


def engine_values(args: argparse.Namespace) -> EngineValues:
    """The engine settings the parsed arguments set, except those the launcher resolves."""
    overrides: dict[str, int] = {}
    flags: dict[str, str | bool] = {}
    for spec, _ in flagged_fields():
        if spec.name in (MODEL_DIR, SERVED_NAME, LORA_MODULES):
            continue
        value = getattr(args, spec.name)
        if setting_kind(spec) != "int":
            flags[spec.name] = value
        elif value is not None:
            overrides[spec.name] = value
    return EngineValues(overrides, flags)
