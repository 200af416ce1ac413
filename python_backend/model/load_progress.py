"""How far transformers is in reading a model's weights, as start-up progress events.

Owns ``weight_progress``: while a ``from_pretrained`` runs, transformers' progress bars over the
weights ("Loading weights" per tensor in transformers 5, "Loading checkpoint shards" per file in
4.x) also report their fraction to a callback. It goes through ``set_tqdm_hook``, transformers'
public hook for its progress bars; where transformers has none, there is no fraction (the stage
lines still show). The bars themselves behave as before: the hook wraps the bar transformers
made, disabled or not, and only counts what passes through it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sized
from typing import Any

from transformers.utils import logging as transformers_logging

# transformers' descriptions of the bars that walk the weights.
WEIGHT_BARS = ("Loading weights", "Loading checkpoint shards")


class _CountedBar:
    """A progress bar that also reports the fraction of ``total`` done to ``report``."""

    def __init__(self, bar: Any, total: int, report: Callable[[float], None]) -> None:
        self._bar = bar
        self._total = total
        self._report = report
        self._done = 0

    def __iter__(self) -> Iterator[Any]:
        for item in self._bar:
            yield item
            self._count(1)

    def update(self, n: int = 1) -> Any:
        self._count(n)
        return self._bar.update(n)

    def _count(self, n: int) -> None:
        self._done += n
        self._report(min(self._done / self._total, 1.0))

    def __enter__(self) -> _CountedBar:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> Any:
        return self._bar.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bar, name)


def _total(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    total = kwargs.get("total")
    if isinstance(total, int):
        return total
    return len(args[0]) if args and isinstance(args[0], Sized) else None


@contextlib.contextmanager
def weight_progress(report: Callable[[float], None]) -> Iterator[None]:
    """Within the block, transformers' weight-loading bars report their fraction to ``report``."""
    set_hook = getattr(transformers_logging, "set_tqdm_hook", None)
    if set_hook is None:  # transformers 4.x
        yield
        return

    def hook(factory: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        bar = previous(factory, args, kwargs) if previous is not None else factory(*args, **kwargs)
        total = _total(args, kwargs)
        if kwargs.get("desc") not in WEIGHT_BARS or not total:
            return bar
        return _CountedBar(bar, total, report)

    previous = set_hook(hook)
    try:
        yield
    finally:
        set_hook(previous)
