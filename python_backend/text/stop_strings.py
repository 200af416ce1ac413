"""Stop strings across token boundaries.

Owns: ``StopStringMatcher``. Text is held back only while its tail could still be the start of a
stop string, so a stop string split over several tokens never leaks into the output, and nothing
else is delayed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StopResult:
    text: str  # text that is safe to emit now
    stopped: bool  # a stop string matched; nothing after it may be emitted


class StopStringMatcher:
    def __init__(self, stops: tuple[str, ...], include_stop: bool) -> None:
        self._stops = tuple(s for s in stops if s)
        self._include = include_stop
        self._pending = ""

    def feed(self, text: str) -> StopResult:
        if not self._stops:
            return StopResult(text, False)
        self._pending += text
        hit_at, hit = -1, ""
        for stop in self._stops:
            pos = self._pending.find(stop)
            if pos >= 0 and (hit_at < 0 or pos < hit_at):
                hit_at, hit = pos, stop
        if hit_at >= 0:
            out = self._pending[: hit_at + (len(hit) if self._include else 0)]
            self._pending = ""
            return StopResult(out, True)
        hold = self._held_suffix()
        cut = len(self._pending) - hold
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return StopResult(out, False)

    def _held_suffix(self) -> int:
        """Length of the longest tail of pending text that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(stop[:size]):
                    best = size
                    break
        return best

    def flush(self) -> str:
        """At the end of the sequence the held text was not a stop string after all."""
        out, self._pending = self._pending, ""
        return out
