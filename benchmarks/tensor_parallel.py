"""What tensor parallel costs on this machine: the engine's tokens/s on N CPU ranks against one.

Each run starts the model as the Triton model does (rank 0 here, the other ranks as worker
processes over gloo), sends ``--requests`` greedy chat requests at once (each to exactly
``--max-tokens`` tokens), and reports completion tokens per second over the wall time, after one
untimed warm-up request. It also prints what each decode step sends between the ranks. On a
2-core CPU the ranks only share the same cores and add the collectives, so N ranks are slower:
the point of tensor parallel is a model that does not fit one device, not speed here.

The demo model (SmolLM2-135M) has 9 attention and 3 key/value heads: it splits over 3 ranks, not 2.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks.inprocess import timed_chat_requests
from python_backend.engine.engine import Engine
from python_backend.intake.intake import Intake
from python_backend.model.loader import load_model
from python_backend.model.threads import serialize_current_thread
from python_backend.parallel.ranks import RankGroup
from python_backend.protocol.settings import EngineSettings

DEMO_MODEL = Path("~/.cache/triton-chat/models/SmolLM2-135M-Instruct").expanduser()


@dataclass
class RanksResult:
    ranks: int
    requests: int
    tokens: int
    wall_s: float
    tokens_per_s: float


@dataclass
class StepTraffic:
    """Bytes between the ranks for each token a forward pass computes (a decode step: one per row)."""

    all_reduce_bytes: int  # one all-reduce: the token's hidden state (hidden x element)
    all_reduces_per_layer: int  # o_proj's output and down_proj's output
    layers: int
    logits_all_gather_bytes: int  # the vocab-parallel lm_head's gathered logits (vocab x element)

    @property
    def bytes_per_token(self) -> int:
        return self.all_reduce_bytes * self.all_reduces_per_layer * self.layers + self.logits_all_gather_bytes


def step_traffic(model_dir: Path, dtype: str) -> StepTraffic:
    config = json.loads((model_dir / "config.json").read_text())
    element = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
    hidden, layers, vocab = int(config["hidden_size"]), int(config["num_hidden_layers"]), int(config["vocab_size"])
    return StepTraffic(hidden * element, 2, layers, vocab * element)


def run(model_dir: Path, dtype: str, ranks: int, requests: int, max_tokens: int) -> RanksResult:
    threads = serialize_current_thread()
    settings = EngineSettings(
        model_path=str(model_dir),
        dtype=dtype,
        device="cpu",
        tensor_parallel_size=ranks,
        max_num_seqs=max(requests, 1),
        torch_threads=threads,
    )
    group = RankGroup.start(settings) if ranks > 1 else None
    mine = group.settings if group is not None else settings
    loaded = load_model(mine)
    engine = Engine(loaded, mine, ranks=group.sync if group is not None else None)
    engine.start()
    try:
        intake = Intake.for_model(loaded, mine)
        # Sent all at once: as many in flight as there are requests.
        tokens, wall = timed_chat_requests(engine, intake, "tp", requests, max(requests, 1), max_tokens)
    finally:
        engine.stop()
        if group is not None:
            group.close()
        torch.set_num_threads(threads)
    return RanksResult(ranks, requests, tokens, round(wall, 3), round(tokens / wall, 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEMO_MODEL)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--ranks", type=int, default=3, help="compared with 1 rank (must divide the heads)")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    args = parser.parse_args()
    results = [run(args.model, args.dtype, n, args.requests, args.max_tokens) for n in (1, args.ranks)]
    traffic = step_traffic(args.model, args.dtype)
    report = {"model": args.model.name, "dtype": args.dtype, "results": [asdict(r) for r in results]}
    report["traffic_per_token"] = {**asdict(traffic), "bytes_per_token": traffic.bytes_per_token}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
