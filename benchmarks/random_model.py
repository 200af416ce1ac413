"""A random-weight model of Qwen2.5-0.5B's shape, for speed comparisons at a larger size.

Weights are random (its text is noise) but every matrix has Qwen2.5-0.5B's shape: 24 layers,
hidden 896, 14 heads / 2 KV heads, MLP 4864, vocabulary 151,936, tied embeddings. The tokenizer
and chat template are borrowed from another local model folder (its ids all fit the vocabulary).

    python -m benchmarks.random_model --tokenizer-from ~/.cache/triton-chat/models/SmolLM2-135M-Instruct \\
        --out /tmp/qwen2.5-0.5b-shape
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM


def build(tokenizer_from: str, out: Path) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
    config = Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # build in bf16 directly: no fp32 copy of 2 GB
    try:
        model = Qwen2ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, do_sample=False)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    config_path = out / "config.json"
    data = json.loads(config_path.read_text())
    data["torch_dtype"] = "bfloat16"
    config_path.write_text(json.dumps(data, indent=2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer-from", required=True)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    build(args.tokenizer_from, args.out)


if __name__ == "__main__":
    main()
