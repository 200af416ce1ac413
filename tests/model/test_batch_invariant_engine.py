"""The batch-invariant mode on a tiny Llama model, float32 and bfloat16: a prompt's logits and greedy
answer are bit-identical alone, in any batch, cold or from the prefix cache, chunked or not."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from python_backend.engine.batch_cache import BatchCache
from python_backend.engine.kv_cache import KVBatch
from python_backend.model.loader import LoadedModel
from python_backend.prompt.chat_template import render_prompt
from python_backend.protocol.params import parse_parameters
from tests.fixtures.device import engine_test_device
from tests.fixtures.engine_driver import Collected, Driver, load_on_cpu, make_engine, running_batch

pytestmark = pytest.mark.skipif(engine_test_device() != "cpu", reason="the batch-invariant mode runs on the CPU")

GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 16, "ignore_eos": True, "logprobs": True}
SYSTEM = "you are a careful assistant who answers in plain words and short sentences. "
PROMPT = SYSTEM + "tell me about the river that runs past the old mill"
OTHERS = [f"question {i}: " + "more words " * (2 * i + 1) for i in range(8)]  # eight lengths


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def invariant(request: pytest.FixtureRequest, tiny_llama_dir: Any) -> LoadedModel:
    return load_on_cpu(tiny_llama_dir, request.param, batch_invariant=True)


@pytest.fixture
def engines(invariant: LoadedModel) -> Iterator[Callable[..., Driver]]:
    started = []

    def start(**settings: Any) -> Driver:
        engine = make_engine(invariant, **settings)
        started.append(engine)
        return Driver(engine, invariant)

    yield start  # a factory: each test starts the engines it needs
    for engine in started:
        engine.stop()


def answer(run: Collected) -> tuple[str, list[float]]:
    """What the user sees: the text and each token's logprob (equal logits give equal logprobs)."""
    run.wait()
    assert run.error is None
    return run.text(), [entry.logprob for d in run.deltas for entry in d.logprobs or []]


def test_the_mode_keeps_the_cache_in_the_models_dtype(invariant: LoadedModel) -> None:
    assert invariant.kv_dtype is None
    attention = invariant.transformers_model.config._attn_implementation
    assert attention == "triton_chat_batch_invariant"


def _ids(loaded: LoadedModel, text: str) -> list[int]:
    return render_prompt(loaded.tokenizer, [{"role": "user", "content": text}], parse_parameters({}))


def _prefill(loaded: LoadedModel, prompts: list[list[int]]) -> torch.Tensor:
    """Last-position logits of ``prompts`` prefilled together, left-padded as the engine does."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.inference_mode():
        out = loaded.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, cache=BatchCache(), use_cache=True
        )
    return out.logits[:, -1, :]


def _decode(loaded: LoadedModel, kv: KVBatch, tokens: list[int], positions: list[int], fast: bool) -> torch.Tensor:
    ids = torch.tensor([[t] for t in tokens])
    where = torch.tensor([[p] for p in positions])
    mask = kv.attention_mask(1, torch.device("cpu")) if kv.padded else None
    with torch.inference_mode():
        if fast:
            assert loaded.fast_decoder is not None
            return loaded.fast_decoder.logits(ids, where, kv.cache, mask.bool() if mask is not None else None)
        out = loaded.model(input_ids=ids, position_ids=where, attention_mask=mask, cache=kv.cache, use_cache=True)
    return out.logits[:, -1, :]


def test_a_rows_logits_are_bitwise_equal_across_batch_sizes(invariant: LoadedModel) -> None:
    prompt = _ids(invariant, PROMPT)
    others = [_ids(invariant, text) for text in OTHERS]
    alone = _prefill(invariant, [prompt])[0]
    paths = [False, True] if invariant.fast_decoder is not None else [False]
    # The prompt's last token from a cache of the rest (a prefix-cache hit) is a decode step.
    for fast in paths:
        cached = running_batch(invariant, [prompt[:-1]], None)
        assert torch.equal(_decode(invariant, cached, [prompt[-1]], [len(prompt) - 1], fast)[0], alone)
    next_token = int(alone.argmax())
    decoded_alone = {
        fast: _decode(invariant, running_batch(invariant, [prompt], None), [next_token], [len(prompt)], fast)[0]
        for fast in paths
    }
    for company in (1, 2, 5, 8):
        # Before and after the prompt, so that it sits at different rows and paddings.
        batch = [*others[: company // 2], prompt, *others[company // 2 : company]]
        row = company // 2
        assert torch.equal(_prefill(invariant, batch)[row], alone)
        tokens = [next_token if i == row else 7 for i in range(len(batch))]
        for fast in paths:
            kv = running_batch(invariant, batch, None)
            logits = _decode(invariant, kv, tokens, [len(p) for p in batch], fast)
            assert torch.equal(logits[row], decoded_alone[fast])


def test_greedy_answer_is_the_same_alone_and_among_others_joining_at_different_steps(
    engines: Callable[..., Driver],
) -> None:
    driver = engines(enable_prefix_caching=False)
    alone = answer(driver.submit(PROMPT, **GREEDY))
    for company, head_start in [(1, 1), (4, 3), (8, 6)]:
        # A short request ends after `head_start` tokens while longer ones run on: the prompt then
        # joins a batch in the middle of its decoding, and more requests join after it.
        starter = driver.submit(OTHERS[0], **{**GREEDY, "max_tokens": head_start})
        early = [driver.submit(text, **{**GREEDY, "max_tokens": 40}) for text in OTHERS[1 : company // 2 + 1]]
        starter.wait()
        target = driver.submit(PROMPT, **GREEDY)
        late = [driver.submit(text, **GREEDY) for text in OTHERS[company // 2 + 1 : company + 1]]
        assert answer(target) == alone
        for run in early + late:
            run.wait()


def test_greedy_answer_is_the_same_cold_and_from_the_prefix_cache(engines: Callable[..., Driver]) -> None:
    expected = answer(engines(enable_prefix_caching=False).submit(PROMPT, **GREEDY))
    driver = engines()
    cold = driver.submit(PROMPT, **GREEDY)
    assert answer(cold) == expected and cold.usage().cached_tokens == 0
    again = driver.submit(PROMPT, **GREEDY)  # cached up to its last token
    assert answer(again) == expected and again.usage().cached_tokens == len(driver.prompt_ids(PROMPT)) - 1
    # A different question after the same system prompt: a partial hit, prefilled with other prompts.
    other = SYSTEM + "and what about the bridge?"
    reference = answer(engines(enable_prefix_caching=False).submit(other, **GREEDY))
    partial = [driver.submit(other, **GREEDY), driver.submit(OTHERS[3], **GREEDY)]
    assert answer(partial[0]) == reference and partial[0].usage().cached_tokens > 0
    partial[1].wait()


def test_greedy_answer_is_the_same_prefilled_in_chunks(engines: Callable[..., Driver]) -> None:
    expected = answer(engines(enable_prefix_caching=False).submit(PROMPT, **GREEDY))
    chunked = engines(enable_prefix_caching=False, max_num_batched_tokens=8)
    assert len(chunked.prompt_ids(PROMPT)) > 2 * 8  # three chunks at least
    assert answer(chunked.submit(PROMPT, **GREEDY)) == expected


def test_the_mode_refuses_what_it_cannot_make_invariant(tiny_llama_dir: Any) -> None:
    from python_backend.model.loader import ModelLoadError

    with pytest.raises(ModelLoadError, match="float32 and bfloat16"):
        load_on_cpu(tiny_llama_dir, "float16", batch_invariant=True)
