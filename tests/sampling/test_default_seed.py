"""--seed: requests without ``seed`` sample from seeds the model's seed source draws, so the same
requests in the same order repeat after a restart; a request's own ``seed`` still wins."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from python_backend.model.loader import LoadedModel, seed_source
from tests.fixtures.engine_driver import Driver, make_engine

SAMPLED: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_tokens": 12, "ignore_eos": True}


def _texts(loaded: LoadedModel, engine_seed: int, **params: Any) -> list[str]:
    """Two requests one after the other on a freshly started engine (a restart)."""
    run = replace(loaded, seeds=seed_source(engine_seed))
    engine = make_engine(run)
    try:
        driver = Driver(engine, run)
        return [driver.submit(content, **{**SAMPLED, **params}).wait().text() for content in ("one", "two")]
    finally:
        engine.stop()


def test_the_same_engine_seed_repeats_sampled_answers(tiny_loaded: LoadedModel) -> None:
    first = _texts(tiny_loaded, 1234)
    assert _texts(tiny_loaded, 1234) == first
    assert _texts(tiny_loaded, 4321) != first


def test_a_requests_seed_wins_over_the_engine_seed(tiny_loaded: LoadedModel) -> None:
    assert _texts(tiny_loaded, 1, seed=99) == _texts(tiny_loaded, 2, seed=99)
