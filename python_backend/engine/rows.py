"""A request's rows as they join the running batch: its sequences and their sampling state.

Owns turning an admitted request (its ``Execution``) into its ``Sequence``s (n, best_of or beam-width of
them): each row's sampling settings (the request's, else the model's defaults), its own generator
(seeded with the request's ``seed``, else one drawn from ``LoadedModel.seeds``, which ``--seed``
seeds), grammar state and detokenizer.
"""

from __future__ import annotations

import torch

from python_backend.engine.execution import Execution
from python_backend.engine.request import RequestGroup
from python_backend.engine.sequence import Sequence
from python_backend.model.loader import LoadedModel
from python_backend.sampling.sampler import RowSampling
from python_backend.sampling.structured import GrammarState
from python_backend.text.detokenizer import IncrementalDetokenizer


def row_sampling(loaded: LoadedModel, group: RequestGroup, index: int) -> RowSampling:
    params = group.request.params
    defaults = loaded.defaults
    seed = params.seed if params.seed is not None else loaded.seeds.getrandbits(64)
    generator = torch.Generator(device=loaded.device)
    generator.manual_seed((seed + index) % (1 << 64))  # distinct draws for each of n choices
    top_k = params.top_k if params.top_k is not None else defaults.top_k
    return RowSampling(
        temperature=params.temperature if params.temperature is not None else defaults.temperature,
        top_p=params.top_p if params.top_p is not None else defaults.top_p,
        top_k=min(top_k, loaded.vocab_size),
        repetition_penalty=params.repetition_penalty,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        generator=generator,
        top_logprobs=params.top_logprobs if params.logprobs else (0 if group.buffered else None),
        prompt_ids=torch.tensor(group.request.prompt_ids, dtype=torch.long),
        grammar=GrammarState(group.request.grammar, loaded.vocab_size) if group.request.grammar is not None else None,
        logit_bias=params.logit_bias,
        min_p=params.min_p,
    )


def new_sequences(loaded: LoadedModel, run: Execution, rope_delta: int = 0) -> list[Sequence]:
    """The request's sequences, one per row, ready to join the batch."""
    group, request = run.group, run.request
    sequences = [
        Sequence(
            index=i,
            request=request,
            sampling=row_sampling(loaded, group, i),
            detokenizer=IncrementalDetokenizer(
                loaded.tokenizer, request.prompt_ids, request.params.skip_special_tokens
            ),
            max_new_tokens=group.max_new_tokens,
            eos_ids=loaded.eos_token_ids,
        )
        for i in range(group.candidates)
    ]
    for seq in sequences:
        seq.rope_delta = rope_delta
        seq.cached_tokens = run.cached_tokens
    return sequences
