"""``config.json`` in MindIE's terms: ServerConfig, ModelConfig and LoraModules.

Owns the file's schema (every key, its type and default; unknown keys and bad values are start-up
errors naming the key) and its translation into the ``serve`` command's flag defaults, so that
flags given on the command line override the file, and the file overrides built-in defaults.

    {
      "ServerConfig": {"ipAddress": "127.0.0.1", "port": 8000, "openAiSupport": "vllm",
                       "fullTextEnabled": false, "allowAllZeroIpListening": false,
                       "httpsEnabled": false, "tlsCert": "", "tlsPk": "", "tlsCaCert": "",
                       "apiKeys": [], "strictParams": false, "tokenTimeout": 600, "e2eTimeout": 600},
      "ModelConfig": {"modelName": "my-model", "modelWeightPath": "/models/my-model",
                      "dtype": "auto", "device": "auto", "maxSeqLen": 0, "maxInputTokenLen": 0,
                      "maxIterTimes": 512, "maxBatchSize": 32, "maxPrefillTokens": 512,
                      "maxQueueSize": 256, "kvCacheMemoryMb": 0,
                      "toolCallParser": "auto", "reasoningParser": "auto"},
      "LoraModules": [{"name": "sql-adapter", "path": "/adapters/sql"}]
    }
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ConfigFileError(ValueError):
    """config.json cannot be used; the message names the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class ServerSection(_Section):
    ipAddress: str = "127.0.0.1"  # MindIE's key names
    port: int = Field(default=8000, ge=1, le=65535)
    openAiSupport: str = "vllm"  # "vllm" (MindIE formats) or anything else (plain OpenAI)
    fullTextEnabled: bool = False
    allowAllZeroIpListening: bool = False  # needed for any non-loopback ipAddress
    httpsEnabled: bool = False
    tlsCert: str = ""  # server certificate (PEM)
    tlsPk: str = ""  # its private key (PEM)
    tlsCaCert: str = ""  # CA for client certificates: set = mutual TLS required
    apiKeys: list[str] = Field(default_factory=list)
    strictParams: bool = False  # unknown request fields: 400 instead of a header
    tokenTimeout: float = Field(default=600.0, gt=0)  # seconds a stream may wait for its next response
    e2eTimeout: float = Field(default=600.0, gt=0)  # seconds a request may take in all


class ModelSection(_Section):
    modelName: str | None = None  # the served name; default: the folder's name
    modelWeightPath: str | None = None  # local folder; default: the demo model
    dtype: str = "auto"
    device: str = "auto"
    maxSeqLen: int = Field(default=0, ge=0)
    maxInputTokenLen: int = Field(default=0, ge=0)
    maxIterTimes: int = Field(default=512, ge=1)
    maxBatchSize: int = Field(default=32, ge=1)  # sequences in the running batch
    maxPrefillTokens: int = Field(default=512, ge=1)  # prompt tokens per step
    maxQueueSize: int = Field(default=256, ge=0)  # waiting requests before 429
    kvCacheMemoryMb: int = Field(default=0, ge=0)
    toolCallParser: str = "auto"
    reasoningParser: str = "auto"
    trustRemoteCode: bool = False  # run code shipped in the model folder (e.g. ChatGLM3)


class LoraEntry(_Section):
    name: str = Field(min_length=1)
    path: str = Field(min_length=1)
    baseModelName: str | None = None  # accepted for MindIE files; one base model here


class ServerFile(_Section):
    ServerConfig: ServerSection = Field(default_factory=ServerSection)
    ModelConfig: ModelSection = Field(default_factory=ModelSection)
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


def flag_defaults(config: ServerFile) -> dict[str, Any]:
    """The ``serve`` parser's defaults (argparse ``dest`` names) that the file sets."""
    server, model = config.ServerConfig, config.ModelConfig
    defaults: dict[str, Any] = {
        "host": server.ipAddress,
        "port": server.port,
        "openai_mode": "vllm" if server.openAiSupport == "vllm" else "openai",
        "full_text": server.fullTextEnabled,
        "allow_external": server.allowAllZeroIpListening,
        "api_keys": list(server.apiKeys),
        "strict_params": server.strictParams,
        "token_timeout": server.tokenTimeout,
        "e2e_timeout": server.e2eTimeout,
        "served_model_name": model.modelName,
        "model": Path(model.modelWeightPath) if model.modelWeightPath else None,
        "dtype": model.dtype,
        "device": model.device,
        "max_seq_len": model.maxSeqLen,
        "max_input_token_len": model.maxInputTokenLen,
        "max_iter_times": model.maxIterTimes,
        "max_num_seqs": model.maxBatchSize,
        "max_num_batched_tokens": model.maxPrefillTokens,
        "max_waiting_requests": model.maxQueueSize,
        "kv_cache_memory_mb": model.kvCacheMemoryMb,
        "tool_call_parser": model.toolCallParser,
        "reasoning_parser": model.reasoningParser,
        "trust_remote_code": model.trustRemoteCode,
        "lora_modules": [f"{m.name}={m.path}" for m in config.LoraModules],
    }
    if server.httpsEnabled:
        if not server.tlsCert or not server.tlsPk:
            raise ConfigFileError("ServerConfig.httpsEnabled needs tlsCert and tlsPk")
        defaults.update(tls_cert=server.tlsCert, tls_key=server.tlsPk, tls_ca_cert=server.tlsCaCert or None)
    return defaults
