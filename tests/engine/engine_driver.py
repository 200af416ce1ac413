"""Drives the real engine without Triton: submit chat requests, collect their events."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from python_backend.engine.engine import Engine
from python_backend.engine.kv_cache import BatchCache, KVBatch
from python_backend.engine.sequence import EngineEvent, EngineRequest
from python_backend.model.loader import LoadedModel, load_model
from python_backend.prompt.chat_template import render_prompt
from python_backend.protocol.contract import ChoiceDelta, ErrorInfo
from python_backend.protocol.params import parse_parameters
from python_backend.protocol.settings import EngineSettings

DEADLINE_S = 60.0


@dataclass
class Collected:
    """Everything one request received, in order."""

    events: list[EngineEvent] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def sink(self, event: EngineEvent) -> None:
        self.events.append(event)
        if event.final:
            self.done.set()

    def wait(self, timeout: float = DEADLINE_S) -> Collected:
        if not self.done.wait(timeout):
            raise TimeoutError("the engine did not finish the request in time")
        return self

    @property
    def deltas(self) -> list[ChoiceDelta]:
        return [e.delta for e in self.events if e.delta is not None]

    @property
    def error(self) -> ErrorInfo | None:
        return next((e.error for e in self.events if e.error is not None), None)

    def text(self, index: int = 0) -> str:
        return "".join(d.text for d in self.deltas if d.index == index)

    def last(self, index: int = 0) -> ChoiceDelta:
        return [d for d in self.deltas if d.index == index][-1]


class Driver:
    """Submits chat requests to an engine and collects their events."""

    def __init__(self, engine: Engine, loaded: LoadedModel) -> None:
        self.engine = engine
        self.loaded = loaded
        self._ids = itertools.count()

    def prompt_ids(self, content: str, **params: Any) -> list[int]:
        return render_prompt(self.loaded.tokenizer, [{"role": "user", "content": content}], parse_parameters(params))

    def submit(
        self,
        content: str,
        stream: bool = True,
        cancelled: Any = None,
        history: list[dict[str, str]] | None = None,
        **params: Any,
    ) -> Collected:
        """A chat request whose last user message is ``content``, after ``history`` (earlier turns)."""
        out = Collected()
        parsed = parse_parameters(params, stream=stream)
        messages = [*(history or []), {"role": "user", "content": content}]
        request = EngineRequest(
            request_id=f"req-{next(self._ids)}",
            prompt_ids=render_prompt(self.loaded.tokenizer, messages, parsed),
            params=parsed,
            sink=out.sink,
            stream=stream,
            **({"is_cancelled": cancelled} if cancelled is not None else {}),
        )
        self.engine.submit(request)
        return out

    def wait_idle(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            stats = self.engine.stats()
            if stats.running_sequences == 0 and stats.waiting_requests == 0 and stats.kv_reserved_tokens == 0:
                return
            time.sleep(0.01)
        raise TimeoutError(f"engine not idle: {self.engine.stats()}")


def make_engine(loaded: LoadedModel, **overrides: Any) -> Engine:
    settings = EngineSettings(model_path="unused", dtype="float32", device="cpu", **{"max_iter_times": 64, **overrides})
    engine = Engine(loaded, settings)
    engine.start()
    return engine


def load_on_cpu(model_dir: Any, dtype: str, **settings: Any) -> LoadedModel:
    """A model folder loaded the way the engine runs it on CPU, with these settings."""
    return load_model(EngineSettings(model_path=str(model_dir), dtype=dtype, device="cpu", **settings))


def running_batch(loaded: LoadedModel, prompts: list[list[int]], kv_dtype: torch.dtype | None) -> KVBatch:
    """Prompts prefilled one by one and joined into a running batch storing ``kv_dtype``.

    Prompts of different lengths make a left-padded batch, as in the engine; ``kv_dtype`` None
    keeps the model's own dtype.
    """
    kv = KVBatch(kv_dtype)
    with torch.inference_mode():
        for prompt in prompts:
            prefill = BatchCache()
            loaded.model(input_ids=torch.tensor([prompt]), cache=prefill, use_cache=True)
            kv.add_states(KVBatch.row_states(prefill, 0), copies=1)
    return kv
