"""benchmarks/step_breakdown.py: each part's own time, and a real engine run split into parts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import step_breakdown
from benchmarks.engine_runs import EngineRun
from benchmarks.step_breakdown import PARTS, Timers, breakdown_of, instrumented


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_nested_part_is_taken_out_of_the_outer_one(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(step_breakdown.time, "perf_counter", clock)
    timers = Timers()

    def inner() -> None:
        clock.now += 2.0

    timed_inner = timers.wrap("products", inner)

    def outer() -> None:
        clock.now += 1.0
        timed_inner()
        timed_inner()
        clock.now += 0.5

    timers.wrap("rest of step", outer)()
    assert timers.seconds == {"products": 4.0, "rest of step": 1.5}
    assert timers.calls == {"products": 2, "rest of step": 1}


def test_breakdown_shares_add_up_and_between_steps_is_the_uncovered_wall() -> None:
    timers = Timers()
    timers.seconds.update({"products": 6.0, "attention": 2.0, "rest of step": 1.0})
    timers.calls["rest of step"] = 100
    run = EngineRun(4, 8, 400, 10.0, 40.0, 1, 2, 3.0, 4.0, 3.0, answers=[])
    row = breakdown_of("bf16", run, timers)
    assert row.steps == 100
    assert row.ms_per_step["products"] == 60.0 and row.ms_per_step["between steps"] == 10.0
    assert set(row.share) == set(PARTS) and sum(row.share.values()) == pytest.approx(1.0, abs=0.01)


def test_patches_are_put_back() -> None:
    from python_backend.cpu.linear import PackedLinear
    from python_backend.engine import steps

    before = (PackedLinear.apply_unchecked, steps.sample, steps.StepRunner.step)
    with instrumented(Timers()):
        assert steps.sample is not before[1]
    assert (PackedLinear.apply_unchecked, steps.sample, steps.StepRunner.step) == before


def test_an_engine_run_is_split_into_parts(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    step_breakdown.main(
        ["--model", str(tiny_model_dir), "--dtype", "float32", "-c", "2", "-n", "2", "--output-len", "6",
         "--output-range", "0", "--input-len", "20", "--input-range", "0", "--variant", "f32:",
         "--variant", "int8head:quantization=int8,quantize_lm_head=true"]
    )  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    row, head = json.loads(lines[0]), json.loads(lines[1])
    assert row["variant"] == "f32" and row["concurrency"] == 2 and row["steps"] >= 6
    # A step of the tiny model runs products, attention, norms and sampling: each was timed.
    for part in ("products", "output head", "attention", "norms", "sampling", "rest of step"):
        assert row["ms_per_step"][part] > 0, part
    # An int8 head (a QuantLinear, as the int8 layers are) is still timed as the head.
    assert head["variant"] == "int8head"
    assert head["ms_per_step"]["output head"] > 0 and head["ms_per_step"]["products"] > 0
    assert lines[2].startswith("| part | f32, C=2 | int8head, C=2 |")
    assert any(line.startswith("| products |") for line in lines)
