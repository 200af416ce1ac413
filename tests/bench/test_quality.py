"""benchmarks/quality.py: the agreement, divergence, window and perplexity arithmetic, and a run on
the tiny model where a mode identical to the reference agrees on every answer and scores the same
perplexity."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.quality import DEFAULT_TEXT, Window, agreement, agreement_prompts, first_divergence, perplexity, windows

ROOT = Path(__file__).resolve().parents[2]


def test_first_divergence_is_the_first_differing_token_or_the_shorter_end() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([5], [6]) == 0
    assert first_divergence([1, 2, 3], [1, 2]) == 2  # one stopped early: they differ where it ended
    assert first_divergence([], []) is None


def test_agreement_counts_identical_answers_and_summarises_the_others() -> None:
    reference = [[1, 2, 3, 4], [1, 2], [7, 7, 7], [4, 4, 4, 4]]
    other = [[1, 2, 3, 4], [1, 3], [7, 7, 7, 7], [0, 4, 4, 4]]
    result = agreement(reference, other)
    assert (result.prompts, result.identical, result.share_identical) == (4, 1, 0.25)
    assert result.first_divergence_mean == pytest.approx((1 + 3 + 0) / 3, abs=0.01)
    assert result.first_divergence_median == 1.0
    same = agreement(reference, reference)
    assert (same.identical, same.share_identical, same.first_divergence_mean) == (4, 1.0, None)
    with pytest.raises(ValueError, match="same prompts"):
        agreement(reference, other[:2])


def test_perplexity_is_exp_of_the_mean_negative_logprob() -> None:
    assert perplexity([math.log(0.5)] * 3) == pytest.approx(2.0)
    assert perplexity([math.log(0.25), math.log(1.0)]) == pytest.approx(2.0)
    assert perplexity([0.0]) == 1.0
    with pytest.raises(ValueError, match="at least one"):
        perplexity([])


def test_windows_score_every_token_but_the_first_once_with_context() -> None:
    spans = windows(10, 4, 2)
    assert spans == [Window(0, 4, 1), Window(2, 6, 4), Window(4, 8, 6), Window(6, 10, 8)]
    scored = [i for w in spans for i in range(w.scored_from, w.end)]
    assert scored == list(range(1, 10))
    assert all(w.scored_from - w.start >= 2 for w in spans[1:])  # window - stride tokens of context
    assert all(w.end - w.start <= 4 for w in spans)
    assert windows(3, 512, 256) == [Window(0, 3, 1)]
    assert windows(1, 4, 2) == []
    with pytest.raises(ValueError, match="stride < window"):
        windows(10, 4, 4)


def test_prompts_are_distinct_and_the_same_every_time() -> None:
    prompts = agreement_prompts(200)
    assert len(set(prompts)) == 200 and prompts == agreement_prompts(200)
    with pytest.raises(ValueError, match="distinct prompts"):
        agreement_prompts(100_000)


def test_the_held_out_text_is_a_few_thousand_words() -> None:
    assert 2000 <= len(DEFAULT_TEXT.read_text(encoding="utf-8").split()) <= 6000


def _run(model: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "benchmarks.quality", "--model", str(model), "--dtype", "float32",
        "--prompts", "4", "--max-tokens", "6", "--text-tokens", "200", "--window", "64", "--stride", "32", *extra,
    ]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_a_mode_identical_to_the_reference_agrees_fully(tiny_model_dir: Path) -> None:
    done = _run(tiny_model_dir, "--variant", "ref:", "--variant", "same:kv_cache_dtype=auto")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert [r["mode"] for r in records] == ["ref", "same"]
    ref, same = records
    assert same["settings"] == {"kv_cache_dtype": "auto"} and "agreement" not in same
    for r in records:
        assert (r["prompts"], r["identical"], r["share_identical"]) == (4, 4, 1.0)
        assert r["first_divergence_mean"] is None and r["first_divergence_median"] is None
        assert 1 <= r["answer_tokens_mean"] <= 6
        assert r["scored_tokens"] == 199 and r["windows"] == 6
        assert r["perplexity"] > 1.0
    assert same["perplexity"] == ref["perplexity"] == same["reference_perplexity"]
    table = [line for line in lines if line.startswith("|")]
    assert table[0].startswith("| mode | settings | identical greedy answers")
    assert table[2].startswith("| ref | defaults | 4 / 4 (100.0 %) | — |")
    assert table[3].startswith("| same | kv_cache_dtype=auto | 4 / 4 (100.0 %) | — |")
    assert table[3].endswith("| +0.00 % |")


def test_a_bad_variant_or_window_names_the_flag(tiny_model_dir: Path) -> None:
    done = _run(tiny_model_dir, "--variant", "ref:", "--variant", "b:no_such_setting=1")
    assert done.returncode != 0 and "unknown model parameter 'no_such_setting'" in done.stderr
    done = _run(tiny_model_dir, "--variant", "ref:", "--stride", "64")
    assert done.returncode != 0 and "--window/--stride" in done.stderr


def test_a_quantized_mode_is_measured_against_the_reference(tiny_model_dir: Path) -> None:
    done = _run(tiny_model_dir, "--variant", "ref:", "--variant", "int8:quantization=int8")
    assert done.returncode == 0, done.stderr[-3000:]
    ref, int8 = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert int8["settings"] == {"quantization": "int8"} and int8["prompts"] == 4
    assert 0 <= int8["identical"] <= 4 and int8["scored_tokens"] == ref["scored_tokens"] == 199
    assert (int8["first_divergence_mean"] is None) == (int8["identical"] == 4)
    assert int8["reference_perplexity"] == ref["perplexity"] and int8["perplexity"] > 1.0
    assert int8["perplexity"] != ref["perplexity"]  # int8 weights change every logit a little
