"""The scheduler's decisions, driven with synthetic requests: no model, no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from python_backend.engine.request import RequestGroup
from python_backend.engine.scheduler import Outcome, Sampled, StepPlan
from tests.engine.scheduler_factories import ids, make_books, no_hits

ROOT = Path(__file__).resolve().parents[2]


def test_requests_are_admitted_first_come_first_served() -> None:
    books = make_books()
    groups = [books.submit(5) for _ in range(3)]
    plan = books.step()
    assert ids([a.group for a in plan.batch]) == ids(groups)
    assert plan.tokens == 15 and not books.scheduler.admission.waiting


def test_the_head_of_the_queue_is_not_overtaken() -> None:
    books = make_books(max_num_seqs=4)
    books.submit(5, n=3, temperature=1.0)
    books.submit(5, n=3, temperature=1.0)
    books.submit(5)  # would fit, but waits behind the second request
    plan = books.step()
    assert ids(plan.admitted) == ["r0"]
    assert ids(list(books.scheduler.admission.waiting)) == ["r1", "r2"]


def test_the_row_limit_holds_requests_until_rows_are_free() -> None:
    books = make_books(max_num_seqs=2)
    for _ in range(3):
        books.submit(5)
    assert ids(books.step().admitted) == ["r0", "r1"]
    assert books.scheduler.running_rows == 2
    assert books.step().empty  # both rows still running
    books.scheduler.finish(books.groups["r0"])
    assert books.scheduler.running_rows == 1
    assert ids(books.step().admitted) == ["r2"]


def test_the_kv_budget_refuses_until_a_reservation_is_released() -> None:
    books = make_books(kv_budget_tokens=100)
    first = books.submit(5, reservation=60)
    books.submit(5, reservation=60)
    assert ids(books.step().admitted) == ["r0"]
    assert books.scheduler.admission.reserved == 60
    assert books.scheduler.running_rows == 1
    assert books.step().empty
    books.scheduler.finish(first)
    assert books.scheduler.admission.reserved == 0
    assert ids(books.step().admitted) == ["r1"]
    assert books.scheduler.admission.reserved == 60


def test_a_long_prompt_is_prefilled_in_chunks_within_the_token_budget() -> None:
    books = make_books(max_num_batched_tokens=16)
    books.submit(40)
    first = books.step()
    assert first.started is not None and (first.started.start, first.started.end, first.started.last) == (0, 16, False)
    books.submit(5)  # arrives while the long prompt is prefilled: it waits for the last chunk
    second = books.step()
    assert second.resumed is not None and (second.resumed.start, second.resumed.end) == (16, 32)
    assert second.admitted == [] and second.tokens == 16
    third = books.step()
    assert third.resumed is not None and (third.resumed.start, third.resumed.end, third.resumed.last) == (32, 40, True)
    assert ids([a.group for a in third.batch]) == ["r1"]  # the budget left after the last chunk
    assert third.tokens == 13
    assert books.scheduler.running_rows == 2
    assert books.step().empty


def test_a_last_chunk_that_fills_the_budget_ends_the_prompts_prefill() -> None:
    # 32 tokens in chunks of 16: the second chunk is the last and takes the whole budget. The
    # next step must not resume the prompt with an empty chunk (it failed the mixed step).
    books = make_books(max_num_batched_tokens=16)
    books.submit(32)
    books.submit(5)
    assert books.step().started is not None
    second = books.step()
    assert second.resumed is not None and (second.resumed.start, second.resumed.end, second.resumed.last) == (
        16,
        32,
        True,
    )
    assert second.tokens == 16 and books.scheduler.running_rows == 1
    third = books.step()
    assert third.resumed is None and ids([a.group for a in third.batch]) == ["r1"]


def test_short_prompts_batch_up_to_the_budget_and_a_longer_one_waits() -> None:
    books = make_books(max_num_batched_tokens=16)
    books.submit(6)
    books.submit(6)
    books.submit(10)
    plan = books.step()
    assert ids([a.group for a in plan.batch]) == ["r0", "r1"] and plan.started is None
    assert books.scheduler.running_rows == 2
    assert ids(books.step().admitted) == ["r2"]


def test_a_prompt_cached_up_to_its_last_token_joins_without_a_prefill() -> None:
    books = make_books()
    cached = books.submit(30)
    partly = books.submit(30)
    beams = books.submit(30, use_beam_search=True, n=2)
    hits = {cached.request.request_id: 29, partly.request.request_id: 20, beams.request.request_id: 29}

    def lookup(group: RequestGroup) -> int | None:
        return hits.get(group.request.request_id)

    plan = books.step(lookup)
    assert [(a.group.request.request_id, a.cached) for a in plan.joins] == [("r0", 29)]
    assert cached.prefill_done == 30
    # A partial hit prefills the rest; beam search always prefills, so its first step sees logits.
    assert [(a.group.request.request_id, a.cached) for a in plan.batch] == [("r1", 20), ("r2", 29)]
    assert plan.tokens == 1 + 10 + 1


def test_a_chunked_prompt_starts_after_its_cached_prefix() -> None:
    books = make_books(max_num_batched_tokens=16)
    books.submit(60)
    plan = books.step(lambda group: 24)
    assert plan.started is not None
    assert (plan.started.start, plan.started.end, plan.started.cached) == (24, 40, 24)
    resumed = books.step(lambda group: 24).resumed
    assert resumed is not None and (resumed.start, resumed.end, resumed.cached) == (40, 56, 0)


def test_a_media_prompt_is_prefilled_alone() -> None:
    books = make_books()
    books.submit(5)
    books.submit(5, media=True)
    books.submit(5)
    first = books.step()
    assert ids([a.group for a in first.batch]) == ["r0"] and first.media is None
    assert books.scheduler.running_rows == 1
    second = books.step()
    assert second.media is not None and second.media.request.request_id == "r1" and second.batch == []
    assert books.scheduler.running_rows == 2
    assert ids(books.step().admitted) == ["r2"]


def test_a_request_cancelled_while_waiting_is_reaped_and_leaves_the_queue() -> None:
    books = make_books(max_num_seqs=1)
    books.submit(5)
    books.submit(5)
    books.step()
    books.scheduler.admission.request_cancel("r1")
    assert ids(books.scheduler.reap()) == ["r1"]
    assert books.scheduler.admission.queued == 0 and not books.scheduler.admission.waiting
    assert ids(books.scheduler.groups) == ["r0"]


def test_a_request_cancelled_after_admission_frees_its_reservation() -> None:
    books = make_books(kv_budget_tokens=100)
    books.submit(40, reservation=70)
    books.submit(5, reservation=70)
    books.scheduler.reap()
    books.step()
    assert books.scheduler.admission.reserved == 70
    books.scheduler.admission.request_cancel("r0")
    assert ids(books.scheduler.reap()) == ["r0"]
    assert books.scheduler.admission.reserved == 0
    assert ids(books.step().admitted) == ["r1"]
    assert books.scheduler.reap() == []  # reaped once only


def test_a_cancelled_chunked_prompt_stops_being_prefilled() -> None:
    books = make_books(max_num_batched_tokens=16)
    books.submit(40)
    books.scheduler.reap()
    books.step()
    books.scheduler.admission.request_cancel("r0")
    assert ids(books.scheduler.reap()) == ["r0"]
    assert books.step().empty and not books.scheduler.has_prefill_work


def test_a_cancel_that_overtakes_its_request_still_reaps_it() -> None:
    books = make_books()
    books.scheduler.admission.request_cancel("r0", before_arrival=True)
    books.scheduler.reap()  # the cancel arrives first and finds nothing
    books.submit(5)
    assert ids(books.scheduler.reap()) == ["r0"]
    assert books.step().empty


def test_n_best_of_and_beams_take_their_rows() -> None:
    books = make_books(max_num_seqs=8)
    books.submit(5, n=3, temperature=1.0)  # 3 rows
    books.submit(5, n=2, best_of=4, temperature=1.0)  # 4 candidates
    books.submit(5, use_beam_search=True, n=2)  # 2 beams: 9 rows in all, one too many
    assert ids(books.step().admitted) == ["r0", "r1"]
    assert books.scheduler.running_rows == 7
    assert books.step(ended=("r0",)).empty  # one of r0's three choices ends in this step
    assert books.scheduler.running_rows == 6
    assert ids(books.step().admitted) == ["r2"]


def test_a_request_ends_when_its_every_choice_has_and_gives_its_reservation_back() -> None:
    books = make_books(kv_budget_tokens=100)
    books.submit(5, reservation=40, n=2, temperature=1.0)
    plan = books.scheduler.schedule(no_hits)
    assert books.scheduler.running_rows == 0  # its prefill has not run yet
    first = books.scheduler.update(plan, [Sampled("r0", False), Sampled("r0", True)])
    assert [o.final for o in first if o is not None] == [False, False]
    assert books.scheduler.running_rows == 1 and books.scheduler.admission.reserved == 40
    last = books.scheduler.update(StepPlan(), [Sampled("r0", True)])
    assert [(o.group.request.request_id, o.final) for o in last if o is not None] == [("r0", True)]
    assert books.scheduler.running_rows == 0 and books.scheduler.admission.reserved == 0
    assert books.scheduler.groups == []
    assert books.scheduler.update(StepPlan(), [Sampled("r0", True)]) == [None]  # it has left


def test_a_beam_search_ends_as_a_whole_and_a_failed_prefill_never_runs() -> None:
    books = make_books()
    beams = books.submit(5, use_beam_search=True, n=3)
    failed = books.submit(5)
    plan = books.scheduler.schedule(no_hits)
    books.scheduler.discard(failed)  # its prefill pass failed
    books.scheduler.update(plan, [Sampled("r0", False)] * 3)
    assert books.scheduler.running_rows == 3
    outcomes = books.scheduler.update(plan, [Sampled("r0", True)] * 3)
    assert outcomes == [Outcome(beams, True), None, None]  # its answers go out once
    assert books.scheduler.running_rows == 0 and not books.scheduler.busy


def test_importing_the_scheduler_loads_no_torch() -> None:
    probe = "import sys, python_backend.engine.scheduler; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
