"""The start events the model's process writes for the launcher: weight loading with its progress,
and each CPU kernel compiled on a first start (or not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as transformers_logging

from python_backend.cpu.native.build import build_library
from python_backend.model.load_progress import weight_progress
from python_backend.protocol.start_events import BEGIN, END, FAILED, KERNEL, PROGRESS, START_EVENTS_ENV, WEIGHTS
from python_backend.protocol.start_events import StartEvent as Event


def _events(path: Path) -> list[Event]:
    return [Event.from_line(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def events_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "events.jsonl"
    monkeypatch.setenv(START_EVENTS_ENV, str(path))
    return path


def test_transformers_weight_bars_report_their_fraction_and_others_do_not() -> None:
    seen: list[float] = []
    before = transformers_logging.set_tqdm_hook(None)
    transformers_logging.set_tqdm_hook(before)
    with weight_progress(seen.append):
        assert list(transformers_logging.tqdm(range(4), desc="Loading weights")) == [0, 1, 2, 3]
        list(transformers_logging.tqdm(range(3), desc="Writing model shards"))
    assert seen == [0.25, 0.5, 0.75, 1.0]
    assert transformers_logging.set_tqdm_hook(before) is before  # put back as it was
    list(transformers_logging.tqdm(range(4), desc="Loading weights"))
    assert len(seen) == 4


def test_loading_the_model_reports_its_weights(tiny_model_dir: Path, events_file: Path) -> None:
    from python_backend.model.loader import load_model
    from python_backend.protocol.settings import EngineSettings

    load_model(EngineSettings(model_path=str(tiny_model_dir), dtype="float32", device="cpu"))
    weights = [event for event in _events(events_file) if event.stage == WEIGHTS]
    assert weights[0].phase == BEGIN and weights[0].detail == f"{tiny_model_dir.name}, float32"
    assert weights[-1].phase == END and weights[-1].seconds is not None
    # The size as read, before the CPU paths repack the linear layers.
    plain: Any = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    size = sum(p.numel() * p.element_size() for p in [*plain.parameters(), *plain.buffers()])
    assert weights[-1].detail == f"{tiny_model_dir.name}, float32, {size / 1e6:.1f} MB"
    progress = [event.fraction for event in weights if event.phase == PROGRESS]
    assert progress and progress[-1] == 1.0 and progress == sorted(progress)  # type: ignore[type-var]


def test_a_kernel_compiled_once_is_one_stage_and_a_failed_one_says_so(tmp_path: Path, events_file: Path) -> None:
    source = tmp_path / "answer.c"
    source.write_text("int answer(void) { return 42; }\n")
    assert build_library(source, cache_dir=tmp_path / "built") is not None
    assert build_library(source, cache_dir=tmp_path / "built") is not None  # reused: no stage
    broken = tmp_path / "broken.c"
    broken.write_text("int broken(void) { return }\n")
    assert build_library(broken, cache_dir=tmp_path / "built") is None
    assert [(e.stage, e.phase, e.detail) for e in _events(events_file)] == [
        (KERNEL, BEGIN, "answer"),
        (KERNEL, END, "answer"),
        (KERNEL, BEGIN, "broken"),
        (KERNEL, FAILED, "broken: the compiler failed (see tritonserver's log)"),
    ]
