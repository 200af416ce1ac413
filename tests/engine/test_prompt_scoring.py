"""``prompt_logprobs`` in the engine: every prefill path scores the prompt as the model does.

The reference is a plain transformers forward of the whole prompt in float32: at every position
after the first, the prompt token's log-probability and rank and the top tokens must be the
log_softmax of that forward's logits, whether the prompt was prefilled in one pass, beside
another prompt, or in chunks (and whatever the scorer's own chunk size).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest
import torch

from python_backend.engine import prompt_scores
from python_backend.engine.sequence import EngineRequest
from python_backend.model.loader import LoadedModel
from python_backend.protocol.errors import ContractError
from python_backend.protocol.params import parse_parameters
from python_backend.protocol.prompt_logprobs import PromptLogprobs
from tests.fixtures.engine_driver import Collected, Driver, make_engine

TOP = 3
ASK: dict[str, Any] = {"temperature": 0, "max_tokens": 2, "prompt_logprobs": TOP}
LONG = "a long question about licences, contracts and the many words lawyers use for them. " * 2


@pytest.fixture
def chunked(tiny_loaded: LoadedModel) -> Iterator[Driver]:
    engine = make_engine(tiny_loaded, max_num_batched_tokens=16)
    yield Driver(engine, tiny_loaded)
    engine.stop()


def reference(loaded: LoadedModel, ids: list[int]) -> torch.Tensor:
    """Log-probabilities [len(ids), vocab] of a plain forward of the whole prompt, float32."""
    with torch.inference_mode():
        logits = loaded.transformers_model(input_ids=torch.tensor([ids], device=loaded.device)).logits[0]
    return torch.log_softmax(logits.float(), dim=-1).cpu()


def scored_prompt(run: Collected) -> PromptLogprobs:
    """The prompt log-probabilities of a finished run: exactly one delta carries them."""
    assert run.error is None, run.error
    carrying = [d.prompt_logprobs for d in run.deltas if d.prompt_logprobs is not None]
    assert len(carrying) == 1
    return carrying[0]


def assert_matches_reference(loaded: LoadedModel, ids: list[int], scored: PromptLogprobs) -> None:
    expected = reference(loaded, ids)
    assert [p.token_id for p in scored] == ids
    assert scored[0].logprob is None and scored[0].rank is None and scored[0].top == ()
    for i in range(1, len(ids)):
        row, position = expected[i - 1], scored[i]
        assert position.logprob is not None and position.rank is not None
        assert abs(position.logprob - float(row[ids[i]])) < 1e-4, i
        # 1 + the more likely tokens, and the equally likely ones of a lower id (sampling.ranks)
        assert position.rank == int((row > row[ids[i]]).sum() + (row[: ids[i]] == row[ids[i]]).sum()) + 1
        values, top_ids = row.topk(TOP)
        assert [c.token_id for c in position.top] == top_ids.tolist()
        assert [c.rank for c in position.top] == [1, 2, 3]
        assert max(abs(c.logprob - float(v)) for c, v in zip(position.top, values, strict=True)) < 1e-4


def test_a_prompt_scored_in_one_pass_matches_a_plain_forward(driver: Driver) -> None:
    run = driver.submit("what is a licence?", stream=False, **ASK).wait()
    assert_matches_reference(driver.loaded, driver.prompt_ids("what is a licence?"), scored_prompt(run))


def test_a_chunked_prompt_matches_a_plain_forward(chunked: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prompt_scores, "CHUNK_POSITIONS", 5)  # several log_softmax chunks per pass too
    ids = chunked.prompt_ids(LONG)
    assert len(ids) > 3 * 16  # several prefill chunks
    run = chunked.submit(LONG, stream=False, **ASK).wait()
    assert_matches_reference(chunked.loaded, ids, scored_prompt(run))


def test_prompts_prefilled_together_are_scored_row_by_row(driver: Driver) -> None:
    # Submitted together, the two prompts (of different lengths) may share a left-padded pass.
    short = driver.submit("hi", stream=False, **ASK)
    plain = driver.submit(LONG, stream=False, temperature=0, max_tokens=2)
    scored = driver.submit(LONG, stream=False, **ASK)
    for run in (short, plain, scored):
        run.wait()
    assert_matches_reference(driver.loaded, driver.prompt_ids("hi"), scored_prompt(short))
    assert_matches_reference(driver.loaded, driver.prompt_ids(LONG), scored_prompt(scored))
    assert plain.text() == scored.text()
    assert all(d.prompt_logprobs is None for d in plain.deltas)


def test_a_scored_prompt_is_never_served_from_the_cache_but_fills_it(driver: Driver) -> None:
    first = driver.submit(LONG, stream=False, **ASK).wait()
    plain = driver.submit(LONG, stream=False, temperature=0, max_tokens=2).wait()
    again = driver.submit(LONG, stream=False, **ASK).wait()
    assert first.usage().cached_tokens == 0 and plain.usage().cached_tokens > 0  # the scored one filled it
    assert again.usage().cached_tokens == 0
    assert_matches_reference(driver.loaded, driver.prompt_ids(LONG), scored_prompt(again))


def test_the_first_response_carries_them_once_streaming_and_with_n(driver: Driver) -> None:
    streamed = driver.submit("what is a licence?", stream=True, **ASK).wait()
    assert streamed.deltas[0].prompt_logprobs is not None
    several = driver.submit("what is a licence?", stream=False, n=2, temperature=1, max_tokens=2, prompt_logprobs=0)
    positions = scored_prompt(several.wait())
    assert all(p.top == () for p in positions) and positions[-1].logprob is not None


def test_a_media_prompt_is_refused_naming_the_field(driver: Driver) -> None:
    request = EngineRequest(
        request_id="media",
        prompt_ids=driver.prompt_ids("look"),
        params=parse_parameters(ASK),
        sink=lambda _event: None,
        media=cast(Any, object()),  # any media inputs: refused before they are read
    )
    with pytest.raises(ContractError) as caught:
        driver.engine.submit(request)
    assert caught.value.info.status == 400 and caught.value.info.param == "prompt_logprobs"
