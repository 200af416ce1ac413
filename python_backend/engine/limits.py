"""Admission limits: context length, output length and the KV-cache memory budget.

Owns: ``Limits`` (resolved once from the settings and the model) with the checks that turn an
over-long prompt into a clear 400 and cap each request's output, and the KV budget in tokens.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from python_backend.model.device import free_memory
from python_backend.model.loader import LoadedModel
from python_backend.protocol.errors import ContractError, context_too_long, kv_cache_exceeded
from python_backend.protocol.params import GenerationParams
from python_backend.protocol.settings import EngineSettings, SettingsError

logger = logging.getLogger(__name__)

_CPU_BUDGET_SHARE = 0.25  # of physical memory, for an automatic CPU KV budget
_CPU_BUDGET_CAP = 8 << 30
_ACCEL_BUDGET_SHARE = 0.5  # of free device memory after the weights are loaded
_PREFIX_SHARE = 8  # an automatic prefix cache gets this fraction (1/N) of the KV budget's bytes


def kv_bytes_per_token(loaded: LoadedModel, dtype: torch.dtype | None = None) -> int:
    """Bytes of keys and values per token over all layers on one rank, stored in ``dtype``
    (default: the KV's)."""
    config = loaded.model.config.get_text_config(decoder=True)
    layers = int(config.num_hidden_layers)
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    heads //= loaded.tensor_parallel_size  # each rank holds its own heads' keys and values
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    element = torch.tensor([], dtype=dtype or loaded.kv_dtype or loaded.dtype).element_size()
    return 2 * layers * heads * head_dim * element


def _automatic_budget(device: torch.device) -> int:
    free = free_memory(device)
    if free is not None:
        return int(free * _ACCEL_BUDGET_SHARE)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(min(physical * _CPU_BUDGET_SHARE, _CPU_BUDGET_CAP))


@dataclass(frozen=True)
class Limits:
    max_seq_len: int  # prompt + output tokens
    max_input_tokens: int  # prompt tokens
    max_iter_times: int  # output tokens
    kv_budget_tokens: int  # token slots the KV budget holds, over all running sequences
    kv_bytes_per_token: int
    prefix_cache_tokens: int = 0  # token positions the prefix cache holds (0: off)

    @staticmethod
    def resolve(settings: EngineSettings, loaded: LoadedModel) -> Limits:
        context = loaded.context_length
        max_seq_len = min(settings.max_seq_len or context, context)
        max_input = max_seq_len - 1
        if settings.max_input_token_len:
            max_input = min(max_input, settings.max_input_token_len)
        per_token = kv_bytes_per_token(loaded)
        budget = settings.kv_cache_memory_mb * (1 << 20) if settings.kv_cache_memory_mb else None
        budget_bytes = budget if budget is not None else _automatic_budget(loaded.device)
        prefix_bytes = 0
        # Multimodal models are left out: a prompt's placeholder tokens do not say which image they
        # stand for, and Qwen2-VL's positions depend on the media (3-D rotary positions).
        if settings.enable_prefix_caching and loaded.media is None:
            prefix_bytes = settings.prefix_cache_memory_mb * (1 << 20) or budget_bytes // _PREFIX_SHARE
            if prefix_bytes > budget_bytes // 2:
                raise SettingsError(
                    f"prefix_cache_memory_mb ({prefix_bytes >> 20} MiB) must be at most half of the KV-cache "
                    f"budget ({budget_bytes >> 20} MiB); raise kv_cache_memory_mb or lower it"
                )
        limits = Limits(
            max_seq_len=max_seq_len,
            max_input_tokens=max_input,
            max_iter_times=settings.max_iter_times,
            # The prefix cache's keys/values come out of the same budget: together they stay in it.
            kv_budget_tokens=max((budget_bytes - prefix_bytes) // per_token, 1),
            kv_bytes_per_token=per_token,
            # Cached prefixes come from prefill caches.
            prefix_cache_tokens=prefix_bytes // kv_bytes_per_token(loaded, loaded.prompt_kv_dtype),
        )
        logger.info(
            "limits: max_seq_len=%d max_input_tokens=%d max_iter_times=%d kv_budget=%d tokens (%.0f MiB) "
            "prefix_cache=%d tokens (%.0f MiB)",
            limits.max_seq_len,
            limits.max_input_tokens,
            limits.max_iter_times,
            limits.kv_budget_tokens,
            (budget_bytes - prefix_bytes) / (1 << 20),
            limits.prefix_cache_tokens,
            prefix_bytes / (1 << 20),
        )
        return limits

    def max_new_tokens(self, prompt_tokens: int, params: GenerationParams) -> int:
        """Reject a prompt that is too long; cap the output (it then ends with ``length``)."""
        if prompt_tokens > self.max_input_tokens:
            raise ContractError(context_too_long(prompt_tokens, self.max_input_tokens))
        wanted = params.max_tokens if params.max_tokens is not None else self.max_iter_times
        return max(min(wanted, self.max_iter_times, self.max_seq_len - prompt_tokens), 1)

    def reservation(self, prompt_tokens: int, max_new: int, sequences: int) -> int:
        """KV slots a request may come to hold; one that can never fit is refused now."""
        needed = (prompt_tokens + max_new) * sequences
        if needed > self.kv_budget_tokens:
            raise ContractError(kv_cache_exceeded(needed, self.kv_budget_tokens))
        return needed
