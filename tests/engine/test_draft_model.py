"""Draft-model speculative decoding on tiny models (float32): the same answers as without it.

The model is the tiny random Qwen2. As its own draft, it proposes what the model would say, so
most drafts are accepted; the tiny Llama (same tokenizer, other weights) mostly disagrees, so
most are rejected and the draft caches are cut back every step. Either way the client must see
exactly what it sees without speculation.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from python_backend.engine.draft_proposer import DraftProposer
from python_backend.model.draft import load_draft
from python_backend.model.loader import LoadedModel, ModelLoadError, load_model
from python_backend.protocol.settings import EngineSettings, SettingsError
from tests.engine.test_speculative import DISTINCT, REPETITIVE, assert_same, run
from tests.fixtures.device import engine_test_device
from tests.fixtures.engine_driver import Driver, make_engine
from tests.fixtures.tiny_models import VOCAB_SIZE, build_tiny_chat_model, train_tiny_tokenizer

GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 32, "ignore_eos": True}


def _with_draft(model: Path, draft: Path, tokens: int = 3) -> LoadedModel:
    settings = EngineSettings(
        model_path=str(model), dtype="float32", device=engine_test_device(),
        speculative_model=str(draft), speculative_model_tokens=tokens,
    )  # fmt: skip
    return load_model(settings)


@pytest.fixture(scope="module")
def self_drafted(tiny_model_dir: Path) -> LoadedModel:
    return _with_draft(tiny_model_dir, tiny_model_dir)


@pytest.fixture(scope="module")
def llama_drafted(tiny_model_dir: Path, tiny_llama_dir: Path) -> LoadedModel:
    return _with_draft(tiny_model_dir, tiny_llama_dir)


def test_a_model_drafting_for_itself_is_identical_and_accepted(tiny_loaded: LoadedModel, self_drafted) -> None:
    requests = [(p, GREEDY) for p in DISTINCT[:3]]
    off = run(tiny_loaded, requests)
    on = run(self_drafted, requests, speculative_model="draft", speculative_model_tokens=3)
    assert_same(off, on)
    stats = on.stats
    # The draft is the model: it disagrees only where the verify pass rounds differently.
    assert stats.spec_decode_num_accepted_tokens >= 0.8 * stats.spec_decode_num_draft_tokens > 0
    # Each verify step of three accepted drafts gives four tokens: far fewer steps than tokens.
    assert stats.spec_decode_num_steps < 3 * 32 / 2


def test_a_disagreeing_draft_changes_nothing_in_a_batch_whose_rows_leave(tiny_loaded, llama_drafted) -> None:
    requests = [(p, {**GREEDY, "max_tokens": 20 + 6 * i}) for i, p in enumerate(DISTINCT + REPETITIVE[:2])]
    off = run(tiny_loaded, requests)
    on = run(llama_drafted, requests, speculative_model="draft", speculative_model_tokens=3)
    assert_same(off, on)
    assert on.stats.spec_decode_num_draft_tokens > 2 * on.stats.spec_decode_num_accepted_tokens


def test_sampled_rows_with_a_draft_keep_their_seeded_answers(tiny_loaded, self_drafted) -> None:
    """A seeded sampled request repeats its answer with a draft model, as it does without one.
    (That verification keeps the distribution is tests/sampling/test_speculative_verify.py's.)"""
    sampled: dict[str, Any] = {"temperature": 1.0, "top_p": 0.9, "max_tokens": 24, "ignore_eos": True, "seed": 7}
    first = run(self_drafted, [(DISTINCT[0], sampled)], speculative_model="draft", speculative_model_tokens=3)
    second = run(self_drafted, [(DISTINCT[0], sampled)], speculative_model="draft", speculative_model_tokens=3)
    assert first.answers[0].error is None and first.answers[0].usage().completion_tokens == 24
    assert first.answers[0].text() == second.answers[0].text()


def test_a_cut_back_draft_cache_proposes_what_a_fresh_one_does(tiny_loaded: LoadedModel, tiny_llama_dir) -> None:
    draft = load_draft(str(tiny_llama_dir), tiny_loaded.tokenizer, torch.device("cpu"), torch.float32, False)
    warm, cold = DraftProposer(draft, 4), DraftProposer(draft, 4)
    context = list(range(40, 60))
    seq = object()  # a row: the proposer keys its state on the row's identity
    proposed = warm.propose(seq, context, limit=10)
    assert len(proposed) == 4
    # The model accepted two drafts, then chose its own token: the cache must forget the rest.
    context = [*context, *proposed[:2], (proposed[2] + 1) % 100]
    again = warm.propose(seq, context, limit=10)
    assert again == cold.propose(object(), context, limit=10)
    assert warm.propose(seq, context, limit=2) == again[:2]
    warm.retain([])
    assert warm.rows == 0


def test_a_draft_with_another_vocabulary_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    other = build_tiny_chat_model(tmp_path / "other", "llama", train_tiny_tokenizer(VOCAB_SIZE - 16))
    with pytest.raises(ModelLoadError, match="speculative_model .* different tokenizer vocabulary"):
        _with_draft(tiny_model_dir, other)
    with pytest.raises(ModelLoadError, match="speculative_model '.*' is not a local model folder"):
        _with_draft(tiny_model_dir, tmp_path / "missing")


def test_draft_model_and_ngram_drafts_are_exclusive() -> None:
    with pytest.raises(SettingsError, match="speculative_model and speculative_ngram_tokens"):
        EngineSettings(model_path="m", speculative_model="d", speculative_ngram_tokens=2)
    with pytest.raises(SettingsError, match="tensor_parallel_size"):
        EngineSettings(model_path="m", speculative_model="d", tensor_parallel_size=2)


def test_a_failing_draft_ends_the_running_requests_and_the_engine_serves_on(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = _with_draft(tiny_model_dir, tiny_model_dir)
    assert loaded.draft is not None
    engine = make_engine(loaded, speculative_model="draft", speculative_model_tokens=3)
    try:
        driver = Driver(engine, loaded)
        with monkeypatch.context() as patch:
            patch.setattr(DraftProposer, "propose", _raise_memory_error)
            failed = driver.submit(DISTINCT[0], **GREEDY).wait()
        assert failed.error is not None and failed.error.status == 500
        answered = driver.submit(DISTINCT[1], **GREEDY).wait()
        assert answered.error is None and answered.usage().completion_tokens == 32
    finally:
        engine.stop()


def _raise_memory_error(*args: Any, **kwargs: Any) -> list[int]:
    raise MemoryError("the draft ran out of memory")


def test_draft_caches_do_not_outlive_their_rows_under_load(self_drafted: LoadedModel) -> None:
    """Rows drafted while the batch was small, then finished while it was large, leave nothing behind."""
    engine = make_engine(self_drafted, speculative_model="draft", speculative_disable_by_batch_size=1)
    try:
        driver = Driver(engine, self_drafted)
        first = driver.submit(DISTINCT[0], **{**GREEDY, "max_tokens": 40})
        assert first.streaming.wait(30)
        others = [driver.submit(p, **GREEDY) for p in DISTINCT[1:]]
        for answer in [first, *others]:
            assert answer.wait().error is None
        assert engine.stats().spec_decode_num_draft_tokens > 0  # the first row was drafted alone
        speculator = engine._steps.speculator
        assert speculator is not None
        deadline = time.monotonic() + 10
        while speculator._proposer.rows and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.01)  # the loop forgets them on its next pass: no event to wait on
        assert speculator._proposer.rows == 0  # type: ignore[attr-defined]
    finally:
        engine.stop()
