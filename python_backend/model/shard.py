"""One rank's shard of a tensor-parallel model, as transformers' own tensor-parallel plan cuts it.

Owns the checks that a folder can be split over N ranks (a text causal LM whose attention and
key/value heads divide by N, no LoRA adapters) and the ``from_pretrained`` arguments that ask
transformers to shard it over the process group the ranks joined (``python_backend.parallel``).
The plan is the model's ``base_model_tp_plan``: q/k/v/gate/up column-parallel, o/down
row-parallel with an all-reduce, embeddings replicated, lm_head vocab-parallel with its logits
gathered, so every rank holds the whole vocabulary's logits after each forward.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch


class ShardError(RuntimeError):
    """The folder cannot be split over the requested ranks; the message says why."""


def check_shardable(config: dict[str, Any], world_size: int, text_model: bool, adapters: int) -> None:
    """Raise ``ShardError`` unless this model splits over ``world_size`` ranks."""
    if not text_model:
        raise ShardError("tensor parallel serves text chat models only (no vision or audio models)")
    if adapters:
        raise ShardError("LoRA adapters cannot be combined with tensor parallel")
    text = config.get("text_config") or config
    heads = int(text.get("num_attention_heads") or 0)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    if heads % world_size or kv_heads % world_size:
        raise ShardError(
            f"the model has {heads} attention and {kv_heads} key/value heads: tensor_parallel_size "
            f"{world_size} must divide both"
        )
    if not torch.distributed.is_initialized():
        raise ShardError("the ranks' process group is not joined (python_backend.parallel joins it first)")
    if torch.distributed.get_world_size() != world_size:
        raise ShardError(f"the process group has {torch.distributed.get_world_size()} ranks, the settings {world_size}")


def shard_arguments() -> dict[str, Any]:
    """``from_pretrained`` keywords that load only this rank's shard (transformers' ``tp_plan``)."""
    try:
        from transformers.distributed import DistributedConfig
    except ImportError:  # transformers 4.x: the keyword itself
        return {"tp_plan": "auto"}
    if "tp_plan" not in inspect.signature(DistributedConfig).parameters:
        return {"tp_plan": "auto"}
    return {"distributed_config": DistributedConfig(tp_plan="auto")}
