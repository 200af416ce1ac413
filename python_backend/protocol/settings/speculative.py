"""Speculative decoding settings: n-gram drafts from the prompt, or a draft model's."""

from __future__ import annotations

from dataclasses import dataclass

from python_backend.protocol.settings.info import LIMITS_GROUP, SettingInfo, setting


@dataclass(frozen=True)
class SpeculativeSettings:
    """Drafts: n-gram lookups in the sequence, or a draft model's tokens."""

    # Prompt-lookup speculation: a row whose recent tokens occurred earlier in its own prompt or
    # output proposes what followed them; one forward pass verifies the proposals, so an answer
    # that copies its prompt takes several tokens per step. Off by default: on prompts that do
    # not repeat, the wider verify steps cost time and buy nothing.
    speculative_ngram_tokens: int = setting(
        0,
        SettingInfo(
            "n-gram speculative decoding: draft tokens proposed per step from the row's own prompt and output; 0 = off",
            flag="--speculative-ngram-tokens",
            minimum=0,
            metavar="K",
            group=LIMITS_GROUP,
            docs="prompt-lookup speculative decoding (vLLM's `ngram` method): each step, a sequence whose "
            "last tokens occurred before in its prompt or output proposes up to K tokens that followed "
            "them, and the step verifies them; greedy answers are identical and sampled ones have the "
            "same distribution. See [design](design.md#speculative-decoding)",
            docs_default="`0` (off)",
        ),
    )
    speculative_ngram_min: int = setting(
        2,
        SettingInfo(
            "shortest n-gram matched for a proposal (vLLM's prompt_lookup_min)",
            flag="--speculative-ngram-min",
            minimum=1,
            metavar="N",
            group=LIMITS_GROUP,
        ),
    )
    speculative_ngram_max: int = setting(
        5,
        SettingInfo(
            "longest n-gram matched for a proposal (vLLM's prompt_lookup_max)",
            flag="--speculative-ngram-max",
            minimum=1,
            metavar="N",
            group=LIMITS_GROUP,
        ),
    )
    # Speculation pays at low concurrency and costs at high (docs/performance.md): above this
    # many running rows a step is a plain one, and prompts may ride in it again (mixed steps).
    speculative_disable_by_batch_size: int = setting(
        0,
        SettingInfo(
            "speculative decoding: plain steps while more than N sequences run (vLLM's disable_by_batch_size); 0 = never",
            flag="--speculative-disable-by-batch-size",
            minimum=0,
            metavar="N",
            group=LIMITS_GROUP,
            docs="with `speculative_ngram_tokens` or `speculative_model`: a step whose running batch has more "
            "than N sequences verifies no drafts, and prompts then join it as in a step without speculation "
            "(`mixed_prefill`), so speculation speeds up the quiet hours and costs nothing under load; `0`: "
            "always speculate. See [performance](performance.md#speculative-decoding)",
            docs_default="`0` (never)",
        ),
    )
    # Draft-model speculation: a small model sharing the tokenizer proposes tokens greedily and
    # the step verifies them as it verifies n-gram drafts. It pays where the draft is much smaller
    # than the model and agrees with it often; the draft runs row by row, so it suits low concurrency.
    speculative_model: str = setting(
        "",
        SettingInfo(
            "local folder of a small draft model for speculative decoding (same tokenizer); empty = none",
            flag="--speculative-model",
            metavar="DIR",
            group=LIMITS_GROUP,
            docs="draft-model speculative decoding (vLLM's `draft_model` method): each step, the draft "
            "model (a local folder whose tokenizer is the model's) proposes `speculative_model_tokens` "
            "tokens per sequence greedily and the step verifies them; greedy answers are identical and "
            "sampled ones have the same distribution. Not with `speculative_ngram_tokens` or tensor "
            "parallel. See [design](design.md#speculative-decoding)",
            docs_default="none",
        ),
    )
    speculative_model_tokens: int = setting(
        4,
        SettingInfo(
            "draft tokens the speculative model proposes per sequence and step",
            flag="--speculative-model-tokens",
            minimum=1,
            metavar="K",
            group=LIMITS_GROUP,
        ),
    )
