"""Traffic that looks real, for any OpenAI-compatible chat endpoint (ours, vLLM, transformers serve).

Every request has its own prompt: a unique first line, then words drawn at random, with prompt
and output lengths drawn from a range (the shape of vLLM's ``benchmark_serving --dataset-name
random``). Output lengths are forced with ``ignore_eos`` + ``min_tokens`` so that every server
generates the same number of tokens. Mixes:

- ``distinct``: prompt words in ``--input-len ± --input-range``, nothing shared;
- ``long``: 1,000-2,000 prompt words, nothing shared;
- ``shared``: one system prompt of ``--shared-len`` words common to every request, then a distinct
  question (where a prefix cache should win).

Arrivals are closed-loop (at most C in flight, ``-c``) or open-loop Poisson (``--rate`` requests/s).
With ``--hog N`` the load runs three times (``hog_runs.py``): alone, beside N busy single-threaded
processes (``cpu_hog.py``), and alone again from the moment they end, each run on prompts of its
own (other first lines, so no prefix cache serves one run from another). A last JSON line gives beside/alone
output tok/s, TTFT p99 and ITL p99, again/alone output tok/s, ``recovery_s`` (seconds from the
neighbours' end until the third run's output rate over a sliding 2-second window first reaches
0.95x the first run's; null if it never does) and whether each target holds (beside >= 0.5x alone,
TTFT p99 beside <= 3x alone, 0.95x alone again within 10 s).
Prints one JSON line per run: output and total tokens/s, TTFT and ITL p50/p99 (ITL over every gap
between content chunks of every request), goodput (requests/s that met the SLO), the prompt
tokens the server counted (its ``usage``), and errors. Every request is bounded by a timeout and
the run by a deadline.

    python -m benchmarks.traffic --base-url http://127.0.0.1:8000/v1 --model NAME --mix distinct -c 16 -n 32
    python -m benchmarks.traffic --base-url http://127.0.0.1:8000/v1 --model NAME -c 16 -n 32 --hog 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from benchmarks.cpu_hog import Arrival, arrivals_of
from benchmarks.hog_runs import HogRatios as HogRatios  # re-exported: traffic_compare imports it from here
from benchmarks.hog_runs import alone_beside_again
from benchmarks.http_stream import StreamingConnection
from benchmarks.load import RequestResult, one_request, percentile

# Common English words: with BPE tokenizers of chat models each is about one token after a space.
_WORD_TEXT = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book eye "
    "job word business issue side kind head house service friend father power hour game line end "
    "member law car city community name president team minute idea kid body information back parent "
    "face others level office door health person art war history party result change morning reason "
    "research girl guy moment air teacher force education foot boy age policy music market sense "
    "nation plan college interest death experience effect use class control care field development "
    "role effort rate heart drug show leader light voice wife police mind price report decision son "
    "view relationship town road arm difference value building action model season society tax "
    "director position player record paper space ground form event official matter center couple site "
    "project activity star table need court oil situation cost industry figure street image phone data "
    "picture practice piece land product doctor wall patient worker news test movie north love support "
    "technology step baby computer type attention film tree source organization hair window evidence"
)
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())

MIXES = ("distinct", "long", "shared")


@dataclass(frozen=True)
class Workload:
    """What one run sends; printed with every figure."""

    mix: str
    input_len: int
    input_range: int
    output_len: int
    output_range: int
    shared_len: int
    seed: int
    variant: int = 0  # another set of first lines for the same lengths (a second run's prompts)


@dataclass(frozen=True)
class TrafficRequest:
    system: str | None
    prompt: str
    max_tokens: int


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def build_requests(workload: Workload, count: int) -> list[TrafficRequest]:
    """``count`` requests of the workload, the same for every server given the same seed."""
    if workload.mix not in MIXES:
        raise ValueError(f"mix must be one of {MIXES}, got {workload.mix!r}")
    rng = random.Random(workload.seed)
    system = _words(random.Random(workload.seed - 1), workload.shared_len) if workload.mix == "shared" else None
    requests = []
    for index in range(count):
        if workload.mix == "long":
            words = rng.randint(1000, 2000)
        else:
            low = max(1, workload.input_len - workload.input_range)
            words = rng.randint(low, workload.input_len + workload.input_range)
        low_out = max(1, workload.output_len - workload.output_range)
        max_tokens = rng.randint(low_out, workload.output_len + workload.output_range)
        # The unique first line keeps a prefix cache from matching more than the chat template.
        run = f"{workload.seed}.{workload.variant}" if workload.variant else str(workload.seed)
        first = f"Request {index} of run {run}: continue the list."
        requests.append(TrafficRequest(system, f"{first}\n{_words(rng, words)}", max_tokens))
    return requests


def request_body(model: str, request: TrafficRequest) -> dict[str, object]:
    messages = [{"role": "user", "content": request.prompt}]
    if request.system is not None:
        messages.insert(0, {"role": "system", "content": request.system})
    return {
        "model": model,
        "messages": messages,
        "max_tokens": request.max_tokens,
        "min_tokens": request.max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


@dataclass
class TrafficReport:
    label: str
    workload: Workload
    arrivals: str  # "closed C=16" or "poisson 2.0/s"
    requests: int
    errors: int
    wall_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    prompt_tokens_mean: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    goodput_rps: float
    slo: str
    error_samples: list[str] = field(default_factory=list)
    hog: int = 0  # busy single-threaded processes beside the server during the run
    after_hog: int = 0  # busy processes that ended right before the run (the run alone again)


def summarize(
    label: str,
    workload: Workload,
    arrivals: str,
    results: list[RequestResult],
    wall_s: float,
    slo_ttft_s: float,
    slo_itl_s: float,
) -> TrafficReport:
    good = [r for r in results if r.ok]
    gaps = [gap for r in good for gap in r.gaps_s]
    output = sum(r.tokens for r in good)
    prompt = sum(r.prompt_tokens for r in good)
    # A request meets the SLO when its first token came in time and its own p99 gap did too.
    met = [r for r in good if r.ttft_s <= slo_ttft_s and percentile(r.gaps_s, 0.99) <= slo_itl_s]
    per_s = (lambda n: round(n / wall_s, 2)) if wall_s > 0 else (lambda n: 0.0)
    return TrafficReport(
        label=label,
        workload=workload,
        arrivals=arrivals,
        requests=len(results),
        errors=len(results) - len(good),
        wall_s=round(wall_s, 3),
        output_tokens_per_s=per_s(output),
        total_tokens_per_s=per_s(output + prompt),
        prompt_tokens_mean=round(prompt / len(good), 1) if good else 0.0,
        ttft_p50_ms=round(percentile([r.ttft_s for r in good], 0.5) * 1e3, 1),
        ttft_p99_ms=round(percentile([r.ttft_s for r in good], 0.99) * 1e3, 1),
        itl_p50_ms=round(percentile(gaps, 0.5) * 1e3, 2),
        itl_p99_ms=round(percentile(gaps, 0.99) * 1e3, 2),
        goodput_rps=per_s(len(met)),
        slo=f"TTFT <= {slo_ttft_s * 1e3:.0f} ms and ITL p99 <= {slo_itl_s * 1e3:.0f} ms",
        error_samples=[r.error for r in results if not r.ok][:3],
    )


async def run_traffic(
    base_url: str | Sequence[str],
    model: str,
    workload: Workload,
    requests: int,
    concurrency: int,
    rate: float | None = None,
    label: str = "server",
    timeout_s: float = 300.0,
    deadline_s: float = 1800.0,
    slo_ttft_s: float = 1.0,
    slo_itl_s: float = 0.1,
    api_key: str | None = None,
    warmup: bool = True,
    arrivals: list[Arrival] | None = None,
) -> TrafficReport:
    """Send ``requests`` requests closed-loop (``rate`` None) or as Poisson arrivals at ``rate``/s.

    With Poisson arrivals ``concurrency`` still caps the connections in flight (a client pool's
    size), so that an overloaded server queues requests in the client rather than without bound.
    Several base URLs (replicas without a balancer) get the connections in turn, so a closed
    loop keeps C/N requests in flight on each. An untimed request goes first unless ``warmup`` is
    False; ``arrivals``, when given, receives every content chunk of the timed requests.
    """
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    bodies = [request_body(model, r) for r in build_requests(workload, requests + 1)]
    pool: asyncio.Queue[StreamingConnection] = asyncio.Queue()
    connections = [
        StreamingConnection(urls[i % len(urls)].rstrip("/") + "/chat/completions", headers) for i in range(concurrency)
    ]
    for connection in connections:
        pool.put_nowait(connection)
    results: list[RequestResult] = []

    async def send(body: dict[str, object]) -> None:
        connection = await pool.get()
        try:
            sent = time.perf_counter()
            result = await one_request(connection, body, timeout_s)
            results.append(result)
            if arrivals is not None:
                arrivals.extend(arrivals_of(sent, result))
        finally:
            pool.put_nowait(connection)

    try:
        if warmup:
            await one_request(connections[0], bodies[-1], timeout_s)  # not timed: first-request costs
        rng = random.Random(workload.seed + 1)
        started = time.perf_counter()

        async def dispatch() -> None:
            # Closed loop: every request waits for a free connection, so at most C are in flight
            # and the next starts as one ends. Open loop: requests arrive on their own clock.
            tasks = []
            for body in bodies[:requests]:
                tasks.append(asyncio.create_task(send(body)))
                if rate is not None:
                    await asyncio.sleep(rng.expovariate(rate))
            await asyncio.gather(*tasks)

        await asyncio.wait_for(dispatch(), deadline_s)
        wall = time.perf_counter() - started
    finally:
        for connection in connections:
            await connection.close()
    shape = f"poisson {rate}/s, at most {concurrency} in flight" if rate is not None else f"closed C={concurrency}"
    return summarize(label, workload, shape, results, wall, slo_ttft_s, slo_itl_s)


def add_workload_arguments(parser: argparse.ArgumentParser, seed: int = 1, output_range: int = 64) -> None:
    """A workload's lengths and seed (``Workload``), as every benchmark that sends one takes them."""
    parser.add_argument("--input-len", type=int, default=256, help="prompt words (about tokens)")
    parser.add_argument("--input-range", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--output-range", type=int, default=output_range)
    parser.add_argument("--seed", type=int, default=seed)


def workload_from(args: argparse.Namespace, mix: str = "distinct", shared_len: int = 0) -> Workload:
    """The workload of ``mix`` with the lengths and seed ``add_workload_arguments`` parsed."""
    return Workload(mix, args.input_len, args.input_range, args.output_len, args.output_range, shared_len, args.seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--mix", choices=MIXES, default="distinct")
    parser.add_argument("-c", "--concurrency", type=int, default=16)
    parser.add_argument("-n", "--requests", type=int, default=0, help="default 2*C")
    parser.add_argument("--rate", type=float, default=None, help="Poisson arrivals per second (default closed loop)")
    add_workload_arguments(parser)
    parser.add_argument("--shared-len", type=int, default=512, help="system prompt words of the shared mix")
    parser.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    parser.add_argument("--slo-itl-ms", type=float, default=100.0)
    parser.add_argument("--label", default="server")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--deadline", type=float, default=1800.0)
    parser.add_argument("--api-key", default=None, help="sent as a Bearer token")
    parser.add_argument(
        "--hog", type=int, default=0, help="also run beside N busy single-threaded processes, then alone again"
    )
    args = parser.parse_args()
    if args.concurrency < 1 or args.requests < 0 or (args.rate is not None and args.rate <= 0) or args.hog < 0:
        parser.error("-c must be >= 1, -n >= 0, --rate > 0 and --hog >= 0")
    workload = workload_from(args, args.mix, args.shared_len)

    def run(load: Workload, *, warmup: bool = True, arrivals: list[Arrival] | None = None) -> TrafficReport:
        return asyncio.run(
            run_traffic(
                args.base_url,
                args.model,
                load,
                args.requests or 2 * args.concurrency,
                args.concurrency,
                args.rate,
                args.label,
                args.timeout,
                args.deadline,
                args.slo_ttft_ms / 1e3,
                args.slo_itl_ms / 1e3,
                args.api_key,
                warmup,
                arrivals,
            )
        )

    if not args.hog:
        sys.stdout.write(json.dumps(asdict(run(workload))) + "\n")
        return
    # A run ends by its deadline; the busy processes a minute after it at the latest.
    runs = alone_beside_again(run, workload, args.hog, args.deadline + 60.0)
    for line in (asdict(runs.alone), asdict(runs.beside), asdict(runs.again), asdict(runs.ratios)):
        sys.stdout.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
