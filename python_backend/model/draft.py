"""The draft model of draft-model speculative decoding: loading it beside the model and checking
that it can propose the model's tokens.

Owns ``load_draft`` and ``DraftModel``. A draft proposes token ids, and the model verifies them
as its own: the two must share one vocabulary, so the draft's tokenizer must map every token
to the same id as the model's (checked here, at load time, not discovered as wrong answers).
The draft runs on the model's device in the model's dtype, through its stock transformers
forward (no prepacking or lean step: it is small, and its exactness does not matter, only how
often it agrees with the model).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from python_backend.model.cache_keyword import cache_keyword

logger = logging.getLogger(__name__)


class DraftLoadError(RuntimeError):
    """The draft folder cannot serve as this model's draft; the message says why."""


@dataclass(frozen=True)
class DraftModel:
    """A causal LM that proposes tokens, and how many of its logits are real token ids."""

    model: Any  # the transformers PreTrainedModel
    vocab_size: int  # the shared tokenizer's size: logits past it (padding rows) are never proposed
    device: torch.device
    cache_arg: str  # the forward's cache keyword (cache_keyword.py)


def load_draft(
    path: str, tokenizer: PreTrainedTokenizerBase, device: torch.device, dtype: torch.dtype, trust_remote_code: bool
) -> DraftModel:
    """Load the draft folder ``path`` for a model whose tokenizer is ``tokenizer``."""
    folder = Path(path).expanduser()
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise DraftLoadError(f"speculative_model '{path}' is not a local model folder with a config.json")
    draft_tokenizer = AutoTokenizer.from_pretrained(
        str(folder), local_files_only=True, trust_remote_code=trust_remote_code
    )
    if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise DraftLoadError(
            f"speculative_model '{path}' has a different tokenizer vocabulary from the model's: "
            "its token ids would not mean the model's tokens"
        )
    model = AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=dtype, local_files_only=True, trust_remote_code=trust_remote_code
    )
    model.to(device)  # type: ignore[arg-type]  # transformers' typed wrapper of nn.Module.to
    model.eval()
    logger.info("loaded draft model %s (%s, %s)", folder.name, device, dtype)
    return DraftModel(model=model, vocab_size=len(tokenizer), device=device, cache_arg=cache_keyword(model))
