"""``config.json`` in MindIE's terms: ServerConfig, ModelConfig and LoraModules.

Owns the file's schema (every key, its type and default; unknown keys and bad values are start-up
errors naming the key) and its translation into the ``serve`` command's flag defaults, so that
flags given on the command line override the file, and the file overrides built-in defaults.
ModelConfig's keys are generated from ``EngineSettings``' ``SettingInfo.mindie_key``, and
ServerConfig's from ``FrontendSettings``' ``FlagInfo.mindie_key`` beside the listener's own.

    {
      "ServerConfig": {"ipAddress": "127.0.0.1", "port": 8000, "openAiSupport": "vllm",
                       "fullTextEnabled": false, "allowAllZeroIpListening": false,
                       "httpsEnabled": false, "tlsCert": "", "tlsPk": "", "tlsCaCert": "",
                       "apiKeys": [], "strictParams": false, "tokenTimeout": 600, "e2eTimeout": 600},
      "ModelConfig": {"modelName": "my-model", "modelWeightPath": "/models/my-model",
                      "dtype": "auto", "device": "auto", "maxSeqLen": 0, "maxInputTokenLen": 0,
                      "maxIterTimes": 512, "maxBatchSize": 32, "maxPrefillTokens": 512,
                      "maxQueueSize": 256, "kvCacheMemoryMb": 0,
                      "toolCallParser": "auto", "reasoningParser": "auto",
                      "worldSize": 1, "npuDeviceIds": ""},
      "LoraModules": [{"name": "sql-adapter", "path": "/adapters/sql"}]
    }
"""

from __future__ import annotations

import json
from copy import copy
from dataclasses import fields
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from openai_frontend.settings import MINDIE_MODE, FrontendSettings, flag_info
from python_backend.protocol.settings import EngineSettings, setting_info, setting_kind


class ConfigFileError(ValueError):
    """config.json cannot be used; the message names the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class _ListenerSection(_Section):
    """ServerConfig's keys of the listener itself; those of FrontendSettings are generated."""

    ipAddress: str = "127.0.0.1"  # MindIE's key names
    port: int = Field(default=8000, ge=1, le=65535)
    allowAllZeroIpListening: bool = False  # needed for any non-loopback ipAddress
    httpsEnabled: bool = False
    tlsCert: str = ""  # server certificate (PEM)
    tlsPk: str = ""  # its private key (PEM)
    tlsCaCert: str = ""  # CA for client certificates: set = mutual TLS required


def _server_section() -> type[_Section]:
    """ServerConfig: the listener's keys and one per ``FrontendSettings`` field with a MindIE key."""
    keys: dict[str, Any] = {}
    for name, spec in FrontendSettings.model_fields.items():
        info = flag_info(name)
        if info is None or info.mindie_key is None:
            continue
        # The file takes any openAiSupport (anything but "vllm" is plain OpenAI), as MindIE does.
        keys[info.mindie_key] = (spec.annotation, copy(spec))
    return create_model("ServerSection", __base__=_ListenerSection, **keys)


ServerSection: Any = _server_section()


def _model_section() -> type[_Section]:
    """ModelConfig: one key per ``EngineSettings`` field with a ``SettingInfo.mindie_key``."""
    keys: dict[str, Any] = {}
    for spec in fields(EngineSettings):
        info = setting_info(spec)
        if info.mindie_key is None:
            continue
        kind: Any = {"bool": bool, "int": int}.get(setting_kind(spec), str)
        if spec.name == "device_ids":  # MindIE writes npuDeviceIds as [[0, 1, 2, 3]]
            keys[info.mindie_key] = (str | list[int] | list[list[int]], Field(default="", description=info.help))
        elif spec.default == "":
            # The model folder and served name: absent means the demo model and the folder's name.
            keys[info.mindie_key] = (kind | None, Field(default=None, description=info.help))
        else:
            keys[info.mindie_key] = (kind, Field(default=spec.default, ge=info.minimum, description=info.help))
    return create_model("ModelSection", __base__=_Section, **keys)


ModelSection: Any = _model_section()


class LoraEntry(_Section):
    name: str = Field(min_length=1)
    path: str = Field(min_length=1)
    baseModelName: str | None = None  # accepted for MindIE files; one base model here


class ServerFile(_Section):
    ServerConfig: ServerSection = Field(default_factory=ServerSection)  # type: ignore[valid-type]
    ModelConfig: ModelSection = Field(default_factory=ModelSection)  # type: ignore[valid-type]
    LoraModules: list[LoraEntry] = Field(default_factory=list)


def load_server_file(path: Path) -> ServerFile:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read it ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise ConfigFileError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    try:
        return ServerFile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigFileError(f"{path}: '{where}': {first['msg']}") from exc


def _device_ids(value: str | list[int] | list[list[int]]) -> str:
    """``npuDeviceIds`` as the setting takes it: ``"0,1"`` from ``"0,1"``, ``[0, 1]`` or ``[[0, 1]]``."""
    if isinstance(value, str):
        return value
    flat = [i for item in value for i in (item if isinstance(item, list) else [item])]
    return ",".join(str(i) for i in flat)


def flag_defaults(config: ServerFile) -> dict[str, Any]:
    """The ``serve`` parser's defaults (argparse ``dest`` names) that the file sets."""
    server, model = config.ServerConfig, config.ModelConfig
    defaults: dict[str, Any] = {
        "host": server.ipAddress,
        "port": server.port,
        "allow_external": server.allowAllZeroIpListening,
        "lora_modules": [f"{m.name}={m.path}" for m in config.LoraModules],
    }
    for name in FrontendSettings.model_fields:
        info = flag_info(name)
        if info is not None and info.mindie_key is not None:
            defaults[info.dest] = getattr(server, info.mindie_key)
    defaults["openai_mode"] = "vllm" if defaults["openai_mode"] == MINDIE_MODE else "openai"
    for spec in fields(EngineSettings):
        key = setting_info(spec).mindie_key
        if key is not None:
            defaults[spec.name] = getattr(model, key)
    defaults["device_ids"] = _device_ids(defaults["device_ids"])
    if defaults["model_path"]:
        defaults["model_path"] = Path(defaults["model_path"])
    if server.httpsEnabled:
        if not server.tlsCert or not server.tlsPk:
            raise ConfigFileError("ServerConfig.httpsEnabled needs tlsCert and tlsPk")
        defaults.update(tls_cert=server.tlsCert, tls_key=server.tlsPk, tls_ca_cert=server.tlsCaCert or None)
    return defaults
