"""Engine settings: what the model reads from its ``config.pbtxt`` parameters.

Owns ``EngineSettings`` (typed, validated, with documented defaults) and its conversion from and
to Triton's string-valued config parameters, so the launcher writes exactly what the model reads.
Its fields are declared by role in this package's modules (``model``, ``limits``,
``speculative``, ``prompt``, ``cpu``), each with the ``SettingInfo`` (``info``) that the launcher's flags, the
``config.json`` mapping and the configuration docs are generated from. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from python_backend.protocol.settings.cpu import CpuSettings
from python_backend.protocol.settings.info import (
    CHATGLM3,
    DEVICE_BASES,
    DTYPES,
    HERMES,
    KV_CACHE_DTYPE_CHOICES,
    LIMITS_GROUP,
    LLAMA3_JSON,
    MISTRAL,
    MODEL_GROUP,
    REASONING_PARSER_CHOICES,
    TOOL_CALL_PARSER_CHOICES,
    TOOL_PARSERS,
    SettingInfo,
    setting_info,
    setting_kind,
)
from python_backend.protocol.settings.limits import LimitSettings
from python_backend.protocol.settings.model import ModelOutputSettings, ModelSettings
from python_backend.protocol.settings.prompt import PromptSettings
from python_backend.protocol.settings.speculative import SpeculativeSettings

__all__ = [
    "CHATGLM3",
    "DTYPES",
    "HERMES",
    "KV_CACHE_DTYPE_CHOICES",
    "LIMITS_GROUP",
    "LLAMA3_JSON",
    "MISTRAL",
    "MODEL_GROUP",
    "REASONING_PARSER_CHOICES",
    "TOOL_CALL_PARSER_CHOICES",
    "TOOL_PARSERS",
    "EngineSettings",
    "SettingInfo",
    "SettingsError",
    "setting_info",
    "setting_kind",
]


class SettingsError(ValueError):
    """A bad engine setting; the message names the key."""


# Fields are collected base by base from the last base to the first, so this order lists the groups
# backwards: model, limits, speculative decoding, prompt, output, CPU (the flags' and the docs' order).
@dataclass(frozen=True)
class EngineSettings(
    CpuSettings, ModelOutputSettings, PromptSettings, SpeculativeSettings, LimitSettings, ModelSettings
):
    """Engine configuration. Every field is a ``config.pbtxt`` parameter of the same name."""

    def __post_init__(self) -> None:
        for spec in fields(self):
            info, value = setting_info(spec), getattr(self, spec.name)
            if info.choices and value not in info.choices:
                raise SettingsError(f"{spec.name} must be one of {', '.join(info.choices)}, got '{value}'")
            if info.minimum is not None and value < info.minimum:
                raise SettingsError(f"{spec.name} must be >= {info.minimum}, got {value}")
        device = self.device
        base = device.split(":", 1)[0]
        if base not in DEVICE_BASES or (":" in device and not device.split(":", 1)[1].isdigit()):
            raise SettingsError(f"device must be auto, cpu, cuda[:N] or npu[:N], got '{device}'")

        if self.speculative_ngram_min > self.speculative_ngram_max:
            raise SettingsError(
                f"speculative_ngram_min ({self.speculative_ngram_min}) must be <= speculative_ngram_max "
                f"({self.speculative_ngram_max})"
            )
        if self.speculative_model and self.speculative_ngram_tokens > 0:
            raise SettingsError("speculative_model and speculative_ngram_tokens: choose one way to draft tokens")
        if self.kv_cache_dtype == "bfloat16" and self.batch_invariant:
            raise SettingsError(
                "kv_cache_dtype bfloat16 does not run with batch_invariant (its kernel reads the model's dtype)"
            )
        if self.speculative_model and self.tensor_parallel_size > 1:
            raise SettingsError("speculative_model does not run with tensor_parallel_size > 1")
        self._check_nodes()
        if self.device_ids:
            ids = self.device_ids.split(",")
            if not all(i.strip().isdigit() for i in ids):
                raise SettingsError(f"device_ids must be comma-separated device indexes, got '{self.device_ids}'")
            if len(ids) != self.ranks_per_node:
                per_node = f" / nnodes {self.nnodes}" if self.nnodes > 1 else ""
                raise SettingsError(
                    f"device_ids names {len(ids)} devices; tensor_parallel_size is {self.tensor_parallel_size}"
                    f"{per_node}" + (f", {self.ranks_per_node} ranks on each node" if per_node else "")
                )

    def _check_nodes(self) -> None:
        """The several-node settings agree: whole ranks per node, a node that exists, an address."""
        if self.tensor_parallel_size % self.nnodes:
            raise SettingsError(
                f"tensor_parallel_size (--tensor-parallel-size) {self.tensor_parallel_size} counts the ranks "
                f"of all nodes and must be a multiple of nnodes (--nnodes) {self.nnodes}"
            )
        if self.node_rank >= self.nnodes:
            raise SettingsError(
                f"node_rank (--node-rank) {self.node_rank} must be below nnodes (--nnodes) {self.nnodes}"
            )
        if self.nnodes > 1 and not (self.master_addr and self.master_port):
            raise SettingsError(
                f"nnodes (--nnodes) {self.nnodes} needs master_addr (--master-addr) and master_port "
                "(--master-port): node 0's address and port, where the other nodes' ranks join"
            )
        if self.master_port > 65535:
            raise SettingsError(f"master_port (--master-port) must be a TCP port, got {self.master_port}")

    @property
    def ranks_per_node(self) -> int:
        """The ranks each node runs: ``tensor_parallel_size / nnodes``."""
        return self.tensor_parallel_size // self.nnodes

    @property
    def first_rank(self) -> int:
        """This node's first rank (node 0 holds rank 0, the one that serves)."""
        return self.node_rank * self.ranks_per_node

    @property
    def rank_device_ids(self) -> list[int]:
        """The device index of each rank, as ``device_ids`` names them; [] when it names none."""
        return [int(i) for i in self.device_ids.split(",")] if self.device_ids else []

    @staticmethod
    def from_parameters(params: dict[str, str]) -> EngineSettings:
        """Build from Triton's ``{"key": "value"}`` parameters; unknown keys are an error."""
        known = {f.name: f for f in fields(EngineSettings)}
        values: dict[str, Any] = {}
        for key, text in params.items():
            if key not in known:
                raise SettingsError(f"unknown model parameter '{key}'")
            kind = setting_kind(known[key])
            if kind == "bool":
                if text.lower() not in ("true", "false", "1", "0"):
                    raise SettingsError(f"model parameter '{key}' must be true or false, got '{text}'")
                values[key] = text.lower() in ("true", "1")
            elif kind == "int":
                try:
                    values[key] = int(text)
                except ValueError as exc:
                    raise SettingsError(f"model parameter '{key}' must be an integer, got '{text}'") from exc
            else:
                values[key] = text
        return EngineSettings(**values)

    def to_parameters(self) -> dict[str, str]:
        def text(value: object) -> str:
            return str(value).lower() if isinstance(value, bool) else str(value)

        return {f.name: text(getattr(self, f.name)) for f in fields(self)}
