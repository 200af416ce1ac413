"""LoRA adapters chosen per request, alongside base-model requests in the same batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from python_backend.engine.engine import Engine
from python_backend.model.loader import load_model
from python_backend.protocol.settings import EngineSettings, SettingsError
from tests.fixtures.engine_driver import Driver


def greedy(model, driver: Driver, content: str, tokens: int) -> str:
    ids = driver.prompt_ids(content)
    out = model.generate(
        torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=tokens,
        do_sample=False, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    text = driver.loaded.tokenizer.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True)
    assert isinstance(text, str)  # one sequence decodes to one string
    return text


def test_adapter_and_base_requests_share_a_batch(tiny_model_dir: Path, tiny_lora_dir: Path) -> None:
    settings = EngineSettings(
        model_path=str(tiny_model_dir),
        dtype="float32",
        device="cpu",
        lora_modules=json.dumps({"sql": str(tiny_lora_dir)}),
    )
    loaded = load_model(settings)
    assert loaded.adapters == frozenset({"sql"})
    engine = Engine(loaded, settings)
    driver = Driver(engine, loaded)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with_adapter = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), str(tiny_lora_dir)
    ).eval()
    prompts = ["first question", "second question"]
    base_expected = [greedy(base, driver, p, 16) for p in prompts]
    lora_expected = [greedy(with_adapter, driver, p, 16) for p in prompts]
    assert base_expected != lora_expected  # the adapter visibly changes the answers
    # Queued before the loop starts: all four share their prefill and every decode step.
    runs = [
        driver.submit(p, temperature=0, max_tokens=16, ignore_eos=True, lora=lora)
        for lora in (None, "sql")
        for p in prompts
    ]
    engine.start()
    try:
        texts = [r.wait().text() for r in runs]
        assert texts == base_expected + lora_expected
        assert all(max(r.usage().batch_size) == 4 for r in runs)
    finally:
        engine.stop()


def test_bad_lora_modules_are_clear_errors(tiny_model_dir: Path, tmp_path: Path) -> None:
    for value, words in (
        ("{not json", "JSON"),
        ('{"x": "/nowhere"}', "not a PEFT adapter folder"),
        ('["a"]', "JSON object"),
    ):
        with pytest.raises(SettingsError, match=words):
            load_model(EngineSettings(model_path=str(tiny_model_dir), dtype="float32", lora_modules=value))
