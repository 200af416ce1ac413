"""Admission, back-pressure and cancellation in the engine's step loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from python_backend.engine.engine import Engine
from python_backend.protocol.errors import ContractError
from python_backend.protocol.settings import EngineSettings, SettingsError
from tests.fixtures.engine_driver import Driver, make_engine


def test_cancel_frees_the_slot_and_ends_with_one_final_event(tiny_loaded, start_engine: Callable[..., Engine]) -> None:
    # Room for thousands of tokens: the request must still be running when it is cancelled.
    engine = start_engine(tiny_loaded, max_iter_times=20000)
    driver = Driver(engine, tiny_loaded)
    flag = threading.Event()
    got = driver.submit("cancel me", temperature=0, max_tokens=20000, ignore_eos=True, cancelled=flag.is_set)
    deadline = time.monotonic() + 10
    while len(got.deltas) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert driver.engine.stats().running_sequences == 1
    flag.set()
    got.wait()
    assert sum(1 for e in got.events if e.final) == 1
    assert got.events[-1].delta is None  # the client is gone: no more text
    assert sum(len(d.text) > 0 for d in got.deltas) < 20000
    driver.wait_idle()
    assert driver.engine.stats().kv_cache_bytes == 0


def test_cancel_by_id_while_waiting(tiny_loaded, start_engine: Callable[..., Engine]) -> None:
    engine = start_engine(tiny_loaded, max_num_seqs=1)
    driver = Driver(engine, tiny_loaded)
    first = driver.submit("long", temperature=0, max_tokens=60, ignore_eos=True)
    second = driver.submit("queued", temperature=0, max_tokens=5)
    engine.cancel("req-1")
    second.wait()
    assert second.deltas == [] and second.events[-1].final
    assert first.wait().usage().completion_tokens == 60


def test_mixed_cancellations_leave_nothing_behind(driver: Driver) -> None:
    flags = [threading.Event() for _ in range(6)]
    runs = [
        driver.submit(f"stream {i}", temperature=0.8, max_tokens=40, ignore_eos=True, cancelled=flags[i].is_set)
        for i in range(6)
    ]
    time.sleep(0.05)
    for flag in flags[::2]:
        flag.set()
    for i, run in enumerate(runs):
        run.wait()
        if i % 2:
            assert run.usage().completion_tokens == 40
    driver.wait_idle()


def test_overload_is_refused_at_once_with_429(tiny_loaded, start_engine: Callable[..., Engine]) -> None:
    engine = start_engine(tiny_loaded, max_num_seqs=1, max_waiting_requests=2)
    driver = Driver(engine, tiny_loaded)
    accepted = [driver.submit("busy", temperature=0, max_tokens=30, ignore_eos=True) for _ in range(2)]
    refused = 0
    for _ in range(3):
        try:
            accepted.append(driver.submit("busy", temperature=0, max_tokens=30, ignore_eos=True))
        except ContractError as exc:
            assert exc.info.status == 429 and exc.info.code == "overloaded"
            refused += 1
    assert refused >= 1
    for run in accepted:
        assert run.wait().last().finish_reason == "length"


def test_long_prompt_is_prefilled_in_chunks_without_stalling_streams(
    tiny_loaded, start_engine: Callable[..., Engine]
) -> None:
    engine = start_engine(tiny_loaded, max_num_batched_tokens=16)
    driver = Driver(engine, tiny_loaded)
    short = driver.submit("short", temperature=0, max_tokens=40, ignore_eos=True)
    time.sleep(0.05)
    long = driver.submit("long prompt " * 60, temperature=0, max_tokens=4, ignore_eos=True)
    short.wait()
    long.wait()
    assert long.last().finish_reason == "length"
    # The short stream kept decoding while the long prompt was prefilled chunk by chunk.
    assert max(short.usage().batch_size) >= 1
    assert len(short.text()) > 0


def test_kv_budget_refuses_a_request_that_can_never_fit(tiny_loaded, start_engine: Callable[..., Engine]) -> None:
    engine = start_engine(tiny_loaded, kv_cache_memory_mb=1)
    driver = Driver(engine, tiny_loaded)
    # 1 MiB holds 2048 tokens of this model (512 bytes each); an eighth goes to the prefix
    # cache, which leaves 1792 for running sequences: 32 choices of 64 + prompt cannot fit.
    assert engine.limits.kv_budget_tokens == 1792
    assert engine.limits.prefix_cache_tokens == 256
    with pytest.raises(ContractError) as caught:
        driver.submit("x", n=32, temperature=1.0, max_tokens=64)
    assert caught.value.info.status == 400 and caught.value.info.code == "kv_cache_exceeded"


def test_a_prefix_cache_larger_than_half_the_kv_budget_is_refused(tiny_loaded) -> None:
    settings = EngineSettings(model_path="unused", device="cpu", kv_cache_memory_mb=8, prefix_cache_memory_mb=5)
    with pytest.raises(SettingsError, match="prefix_cache_memory_mb .* at most half of the KV-cache budget"):
        Engine(tiny_loaded, settings)
    without = EngineSettings(model_path="unused", device="cpu", kv_cache_memory_mb=8, enable_prefix_caching=False)
    limits = Engine(tiny_loaded, without).limits
    assert (limits.kv_budget_tokens, limits.prefix_cache_tokens) == (8 * 2048, 0)


def test_stop_fails_pending_requests_with_503(tiny_loaded) -> None:
    engine = make_engine(tiny_loaded, max_num_seqs=1)
    driver = Driver(engine, tiny_loaded)
    runs = [driver.submit("x", temperature=0, max_tokens=60, ignore_eos=True) for _ in range(3)]
    engine.stop()
    for run in runs:
        run.wait(5)
        assert run.events[-1].final
    assert any(r.error is not None and r.error.status == 503 for r in runs)


def test_stop_ends_every_running_row_with_503(tiny_loaded) -> None:
    """Shutdown compacts the batch row by row; every running request still gets its final 503."""
    engine = make_engine(tiny_loaded, max_num_seqs=4)
    driver = Driver(engine, tiny_loaded)
    runs = [driver.submit("x", temperature=0, max_tokens=400, ignore_eos=True) for _ in range(3)]
    for run in runs:
        assert run.streaming.wait(30), "every request is running before the stop"
    engine.stop()
    for run in runs:
        run.wait(5)
        assert run.error is not None and run.error.status == 503
