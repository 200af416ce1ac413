"""Mixed steps: prompt tokens in the decode step's forward pass give what separate passes give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from python_backend.cpu.fast_decode import DecodeRows, PromptSegment
from python_backend.cpu.prompt_attention import PromptAttentionKernel, build_prompt_kernel
from python_backend.engine.batch_cache import BatchCache
from python_backend.model.loader import LoadedModel
from tests.engine.test_generation import decode, generate_greedy
from tests.fixtures.engine_driver import Driver, copy_batch, load_on_cpu, make_engine, running_batch
from tests.fixtures.tiny_models import build_tiny_chat_model


def _prefilled(loaded: LoadedModel, tokens: list[int]) -> BatchCache:
    cache = BatchCache()
    if tokens:
        loaded.model(input_ids=torch.tensor([tokens]), cache=cache, use_cache=True)
    return cache


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_mixed_logits_equal_separate_passes(family: str, tiny_model_dir: Path, tiny_llama_dir: Path) -> None:
    loaded = load_on_cpu(tiny_model_dir if family == "qwen2" else tiny_llama_dir, "float32")
    fast = loaded.fast_decoder
    assert fast is not None
    running = [list(range(3, 40)), list(range(50, 61))]
    reference_kv = running_batch(loaded, running, loaded.kv_dtype)
    mixed_kv = copy_batch(reference_kv)
    # A whole new prompt, one continuing from 12 cached positions, and a first chunk (no logits).
    fresh, continued, chunked = list(range(70, 95)), list(range(5, 33)), list(range(100, 140))
    cpu = torch.device("cpu")
    with torch.inference_mode():
        ids, positions = torch.tensor([[11], [12]]), torch.tensor([[len(p)] for p in running])
        keep = reference_kv.attention_mask(1, cpu).bool()
        expected_decode = fast.logits(ids, positions, reference_kv.cache, keep)
        expected_fresh = loaded.model(input_ids=torch.tensor([fresh])).logits[:, -1]
        expected_continued = loaded.model(input_ids=torch.tensor([continued])).logits[:, -1]
        segments = [
            PromptSegment(fresh, 0, BatchCache(), True),
            PromptSegment(continued[12:], 12, _prefilled(loaded, continued[:12]), True),
            PromptSegment(chunked[:16], 0, BatchCache(), False),
        ]
        out = fast.mixed_logits(DecodeRows(ids, positions, mixed_kv.cache, keep), segments)
        assert out.decode is not None
        assert torch.allclose(out.decode, expected_decode, atol=1e-4, rtol=1e-4)
        assert out.segments[0] is not None and out.segments[1] is not None and out.segments[2] is None
        assert torch.allclose(out.segments[0], expected_fresh, atol=1e-4, rtol=1e-4)
        assert torch.allclose(out.segments[1], expected_continued, atol=1e-4, rtol=1e-4)
        # The running cache gained the step's token; the chunk's cache holds its 16 positions, and
        # its next chunk, alone in a step without decode rows, completes the prompt exactly.
        assert mixed_kv.length == reference_kv.length
        for (k, v), (rk, rv) in zip(mixed_kv.cache.layer_states(), reference_kv.cache.layer_states(), strict=True):
            assert torch.allclose(k, rk, atol=1e-5) and torch.allclose(v, rv, atol=1e-5)
        assert segments[2].cache.get_seq_length() == 16
        rest = fast.mixed_logits(None, [PromptSegment(chunked[16:], 16, segments[2].cache, True)])
        assert rest.decode is None and rest.segments[0] is not None
        expected_chunked = loaded.model(input_ids=torch.tensor([chunked])).logits[:, -1]
        assert torch.allclose(rest.segments[0], expected_chunked, atol=1e-4, rtol=1e-4)


PROMPTS = [
    "a",
    "a bit longer prompt than the first",
    "the longest prompt of them all, " * 5,
    "mid length one, with a comma",
    "the longest prompt of them all, " * 5 + "and then some more words",  # a prefix-cache hit
]


def _answers(loaded: LoadedModel, **settings: Any) -> list[Any]:
    # A small token budget spreads the prompts over many steps: later ones prefill (some in
    # chunks) in the same passes as the earlier ones' decode steps.
    engine = make_engine(loaded, max_num_batched_tokens=24, **settings)
    try:
        driver = Driver(engine, loaded)
        runs = [driver.submit(p, temperature=0, max_tokens=10, ignore_eos=True) for p in PROMPTS]
        return [r.wait() for r in runs]
    finally:
        engine.stop()


def test_prompts_prefilled_inside_decode_steps_answer_as_alone(
    tiny_loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = tiny_loaded.fast_decoder
    assert fast is not None
    counted: list[tuple[int, int]] = []  # (decode rows, prompt segments) of each mixed pass
    original = fast.mixed_logits

    def counting(rows: DecodeRows | None, segments: list[PromptSegment]) -> Any:
        counted.append((rows.input_ids.shape[0] if rows is not None else 0, len(segments)))
        return original(rows, segments)

    monkeypatch.setattr(fast, "mixed_logits", counting)
    driver = Driver(make_engine(tiny_loaded), tiny_loaded)
    try:
        expected = [decode(driver, generate_greedy(driver, p, 10)) for p in PROMPTS]
    finally:
        driver.engine.stop()
    mixed = _answers(tiny_loaded)
    assert any(rows and segments for rows, segments in counted), counted  # prompts rode with decode rows
    counted.clear()
    separate = _answers(tiny_loaded, mixed_prefill=False)
    assert counted and not any(segments for _rows, segments in counted)  # decode-only steps
    assert [r.text() for r in mixed] == expected == [r.text() for r in separate]
    assert [r.usage().cached_tokens for r in mixed] == [r.usage().cached_tokens for r in separate]
    assert mixed[-1].usage().cached_tokens > 0
    for run in mixed:
        usage = run.usage()
        assert usage.completion_tokens == 10 and len(usage.batch_size) == 10


def test_speculation_and_batch_invariance_keep_prefill_separate(tiny_loaded: LoadedModel, tiny_llama_dir: Path) -> None:
    for settings in ({"speculative_ngram_tokens": 3}, {"mixed_prefill": False}):
        engine = make_engine(tiny_loaded, **settings)
        try:
            assert not engine._steps.mixes_now()
        finally:
            engine.stop()
    engine = make_engine(tiny_loaded)
    try:
        assert engine._steps.mixes
    finally:
        engine.stop()
    invariant = load_on_cpu(tiny_llama_dir, "float32", batch_invariant=True)
    assert invariant.fast_decoder is not None and not invariant.fast_decoder.mixes
    engine = make_engine(invariant)
    try:
        assert not engine._steps.mixes
    finally:
        engine.stop()


def test_bfloat16_prompt_segments_attend_through_the_tiled_kernel(
    tmp_path: Path, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In bfloat16 a mixed step's prompt segments go to the tiled kernel (where the CPU has
    AVX512-BF16) and their logits agree with the model's own forward within bfloat16 rounding."""
    tiles = build_prompt_kernel()
    if tiles is None:
        pytest.skip("no C compiler or no AVX512-BF16: prompts attend through the decode kernel")
    # Heads of 64 (the kernel takes multiples of 32; the shared tiny models' are 16), 2 per KV head.
    shape = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1}
    loaded = load_on_cpu(build_tiny_chat_model(tmp_path, "llama", tiny_tokenizer, shape=shape), "bfloat16")
    fast = loaded.fast_decoder
    assert fast is not None
    calls: list[int] = []
    original = PromptAttentionKernel.attend

    def counted(self: PromptAttentionKernel, query: torch.Tensor, *args: Any) -> torch.Tensor:
        calls.append(query.shape[2])
        return original(self, query, *args)

    monkeypatch.setattr(PromptAttentionKernel, "attend", counted)
    fresh, continued = list(range(70, 101)), list(range(5, 40))
    with torch.inference_mode():
        expected = [loaded.model(input_ids=torch.tensor([p])).logits[:, -1].float() for p in (fresh, continued)]
        calls.clear()
        segments = [
            PromptSegment(fresh, 0, BatchCache(), True),
            PromptSegment(continued[20:], 20, _prefilled(loaded, continued[:20]), True),
        ]
        out = fast.mixed_logits(None, segments)
    layers = len(loaded.model.model.layers)
    assert sorted(set(calls)) == [15, 31] and len(calls) == 2 * layers
    for got, want in zip(out.segments, expected, strict=True):
        assert got is not None
        assert torch.allclose(got.float(), want, atol=0.1, rtol=0.05)
        assert int(got.float().argmax()) == int(want.argmax())
