"""Loading a local Hugging Face chat-model folder: tokenizer, weights and generation defaults.

Owns: ``load_model`` and ``LoadedModel`` (everything the engine needs to know about the model:
EOS ids, context length, vocabulary size, sampling defaults from ``generation_config.json``).
Vision and audio chat models (``model_type`` qwen2_vl, qwen2_5_vl, qwen2_audio) load with their
own classes and bring a ``MediaProcessor``; every other folder is a causal LM that takes text only.
Nothing is ever fetched from a hub: the folder must exist locally. Reading the weights is the
start-up stage ``WEIGHTS`` (``protocol.start_events``), with its progress where transformers says it.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from python_backend.cpu.argmax import RowArgmax, build_row_argmax
from python_backend.cpu.attention import use_decode_attention
from python_backend.cpu.batch_invariant import InvariantAttend, install_batch_invariant, use_invariant_attention
from python_backend.cpu.bf16_gemm import build_bf16_gemm
from python_backend.cpu.fast_decode import FastDecoder
from python_backend.cpu.fused_norm import build_norm_kernel, fuse_norms
from python_backend.cpu.fused_rope import build_rope_kernel
from python_backend.cpu.linear import pack_linears, prepack_supported
from python_backend.cpu.native.attention_kernel import DecodeAttentionKernel, build_kernel
from python_backend.cpu.native.invariant_attention import InvariantAttentionKernel, build_invariant_kernel
from python_backend.cpu.prompt_attention import build_prompt_kernel
from python_backend.cpu.silu import build_silu_kernel, fuse_silu
from python_backend.model.device import place, synchronize
from python_backend.model.draft import DraftLoadError, DraftModel, load_draft
from python_backend.model.load_progress import weight_progress
from python_backend.model.lora import attach_adapters, parse_lora_modules
from python_backend.model.quantization import (
    QuantizationError,
    QuantPlan,
    load_arguments,
    plan_quantization,
    quantize_model,
)
from python_backend.model.shard import ShardError, check_shardable, shard_arguments
from python_backend.model.tokenizer import TokenizerError, load_tokenizer
from python_backend.prompt.multimodal.processor import AUDIO_MODEL_TYPES, VISION_MODEL_TYPES, MediaProcessor
from python_backend.protocol.settings import EngineSettings
from python_backend.protocol.start_events import WEIGHTS, StageReporter

logger = logging.getLogger(__name__)

DEFAULT_TOP_K = 1000  # MindIE's (ATB's) default when neither config names top_k


class ModelLoadError(RuntimeError):
    """The model folder cannot be served; the message says why."""


@dataclass(frozen=True)
class SamplingDefaults:
    """Values used when a request leaves a parameter out (generation_config.json, else reference)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = DEFAULT_TOP_K


@dataclass
class LoadedModel:
    model: Any  # the PreTrainedModel, or a peft PeftModel around it when LoRA adapters are loaded
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype
    eos_token_ids: frozenset[int]
    context_length: int  # max_position_embeddings
    vocab_size: int
    defaults: SamplingDefaults
    name: str
    model_type: str = ""  # config.json model_type ("qwen2", "chatglm", ...)
    base_model: PreTrainedModel | None = None  # the transformers model itself (model unwrapped)
    adapters: frozenset[str] = frozenset()  # LoRA adapter names requests may ask for
    media: MediaProcessor | None = None  # a multimodal model's prompt step; None: text only
    kv_dtype: torch.dtype | None = None  # the running batch's KV storage; None: ``dtype``
    fast_decoder: FastDecoder | None = None  # the lean CPU decode step (fast_decode.py), where exact
    # Greedy sampling's argmax (cpu/argmax.py's kernel); None: PyTorch's max.
    row_argmax: Callable[[torch.Tensor], list[int]] | None = None
    tensor_parallel_size: int = 1  # ranks the weights and KV heads are split over (shard.py)
    draft: DraftModel | None = None  # draft-model speculation's proposer model (draft.py)
    # Where a request without `seed` gets its seed (the engine thread draws, in admission order).
    seeds: random.Random = field(default_factory=random.SystemRandom)

    @property
    def prompt_kv_dtype(self) -> torch.dtype:
        """The keys/values of prefills and the prefix cache: the model's dtype, or the running batch's
        where that is narrower (``--kv-cache-dtype bfloat16`` under a float32 model), so that every
        attention reads the same rounded keys and values, cold or from the prefix cache."""
        kv = self.kv_dtype
        if kv is not None and kv.is_floating_point and torch.finfo(kv).bits < torch.finfo(self.dtype).bits:
            return kv
        return self.dtype

    @property
    def uses_mrope(self) -> bool:
        """Qwen2-VL's 3-D rotary positions: media prefill needs the model's rope index."""
        return self.model_type in VISION_MODEL_TYPES

    @property
    def transformers_model(self) -> PreTrainedModel:
        return self.base_model if self.base_model is not None else self.model


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as handle:
        data = json.load(handle)
    return data if isinstance(data, dict) else {}


def _as_ids(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def _sampling_defaults(gen: dict[str, Any], config: dict[str, Any], vocab_size: int) -> SamplingDefaults:
    # top_k: generation_config.json first, then config.json, then 1000 (MindIE's ATB default).
    top_k = gen.get("top_k", config.get("top_k", DEFAULT_TOP_K))
    top_k = DEFAULT_TOP_K if not isinstance(top_k, int) or top_k < 0 else top_k
    if top_k == 0 or top_k > vocab_size:
        top_k = vocab_size
    # A generation_config that says `do_sample: false` asks for greedy decoding (transformers'
    # meaning); one that says nothing leaves MindIE's default of 1.0 to its temperature.
    temperature = 0.0 if gen.get("do_sample") is False else float(gen.get("temperature", 1.0))
    return SamplingDefaults(
        temperature=temperature,
        top_p=float(gen.get("top_p", 1.0)),
        top_k=top_k,
    )


def _model_class(model_type: str) -> Any:
    """The Auto class for the folder: vision and audio chat models are not causal-LM classes."""
    if model_type in VISION_MODEL_TYPES:
        from transformers import AutoModelForImageTextToText

        return AutoModelForImageTextToText
    if model_type in AUDIO_MODEL_TYPES:
        # transformers 4.x has no Auto class for it (AutoModelForMultimodalLM is 5.x only).
        from transformers import Qwen2AudioForConditionalGeneration

        return Qwen2AudioForConditionalGeneration
    return AutoModelForCausalLM


def _invariant_kernel(settings: EngineSettings, cpu_text: bool, dtype: torch.dtype) -> InvariantAttentionKernel:
    """The batch-invariant attention kernel, or why the mode cannot run this model."""
    if not cpu_text or settings.tensor_parallel_size > 1:
        raise ModelLoadError("batch_invariant runs text models on the CPU only, without tensor parallel")
    if dtype not in InvariantAttentionKernel.dtypes():
        raise ModelLoadError(f"batch_invariant runs float32 and bfloat16 models, not {dtype}")
    kernel = build_invariant_kernel()
    if kernel is None:
        raise ModelLoadError("batch_invariant needs a C compiler to build its attention kernel (see the log)")
    return kernel


def _narrow_kv_dtype(cpu_text: bool, dtype: torch.dtype) -> torch.dtype | None:
    """The running batch's storage for ``kv_cache_dtype`` bfloat16, or why this model cannot have it."""
    if not cpu_text:
        raise ModelLoadError("kv_cache_dtype 'bfloat16' is for text models on CPU; use 'auto' for this model")
    if dtype == torch.float16:
        raise ModelLoadError("kv_cache_dtype 'bfloat16' needs a float32 or bfloat16 model, not float16")
    return torch.bfloat16 if dtype == torch.float32 else None  # a bfloat16 model's own dtype


def _weight_bytes(model: torch.nn.Module) -> int:
    """What the model's parameters and buffers take in memory."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def _size(count: int) -> str:
    """Bytes for a person: GB from 0.1 GB up, MB below (a test model's weights are a few MB)."""
    return f"{count / 1e9:.2f} GB" if count >= 1e8 else f"{count / 1e6:.1f} MB"


def seed_source(seed: int) -> random.Random:
    """The generator of the seeds of requests without one: seeded with ``seed`` (vLLM's
    ``--seed``), so a restart samples the same answers for the same requests; -1: the OS's entropy."""
    return random.SystemRandom() if seed < 0 else random.Random(seed)


def _quantization(
    settings: EngineSettings, config: dict[str, Any], device: torch.device, text: bool, adapters: int
) -> QuantPlan:
    """The folder's quantization plan (quantization.py), or why this model cannot run quantized."""
    try:
        plan = plan_quantization(settings.quantization, config, settings.quantize_lm_head)
    except QuantizationError as exc:
        raise ModelLoadError(str(exc)) from exc
    if plan.quantized:
        field = "quantization" if plan.mode != "none" else "quantize_lm_head"
        if device.type not in ("cpu", "cuda", "npu"):
            raise ModelLoadError(f"{field} ({plan.summary}) runs on CPU, CUDA and Ascend NPUs, not on '{device}'")
        if not text:
            raise ModelLoadError(f"{field} serves text models only; this folder is a vision/audio model")
        if settings.tensor_parallel_size > 1 or adapters or settings.batch_invariant:
            raise ModelLoadError(
                f"{field} ({plan.summary}) does not run with tensor_parallel_size > 1, lora_modules or batch_invariant"
            )
    return plan


def load_model(settings: EngineSettings) -> LoadedModel:
    """Load the folder named by ``settings.model_path`` onto the chosen device and dtype."""
    folder = Path(settings.model_path).expanduser()
    if not settings.model_path or not folder.is_dir():
        raise ModelLoadError(f"model_path '{settings.model_path}' is not a local model folder")
    config = _read_json(folder / "config.json")
    if not config:
        raise ModelLoadError(f"'{folder}' has no config.json")
    gen = _read_json(folder / "generation_config.json")
    placement = place(settings.device, settings.dtype, config.get("torch_dtype") or config.get("dtype"))
    started = time.monotonic()
    remote = settings.trust_remote_code
    try:
        tokenizer = load_tokenizer(settings, folder)
    except TokenizerError as exc:
        raise ModelLoadError(str(exc)) from exc
    adapters = parse_lora_modules(settings.lora_modules)
    model_type = str(config.get("model_type") or "")
    model_class = _model_class(model_type)
    extra: dict[str, Any] = {}
    kv_dtype: torch.dtype | None = None
    kernel: DecodeAttentionKernel | None = None
    argmax: RowArgmax | None = None
    world = settings.tensor_parallel_size
    if world > 1:
        try:
            check_shardable(config, world, model_class is AutoModelForCausalLM, len(adapters))
        except ShardError as exc:
            raise ModelLoadError(str(exc)) from exc
        extra.update(shard_arguments())
    cpu_text = placement.device.type == "cpu" and model_class is AutoModelForCausalLM
    quant = _quantization(settings, config, placement.device, model_class is AutoModelForCausalLM, len(adapters))
    extra.update(load_arguments(quant))
    invariant = _invariant_kernel(settings, cpu_text, placement.dtype) if settings.batch_invariant else None
    if invariant is not None:
        # One attention for prefill and decode (batch_invariant.py), over a cache in the model's dtype.
        extra["attn_implementation"] = use_invariant_attention(invariant)
    elif cpu_text:
        # One-query-row attention without SDPA's CPU overhead (attention.py); prefill unchanged.
        if settings.cpu_native_attention and placement.dtype in (torch.bfloat16, torch.float32) and world == 1:
            kernel = build_kernel()  # None (logged) without a C compiler
            argmax = build_row_argmax() if kernel is not None else None
        extra["attn_implementation"] = use_decode_attention(kernel)
        if kernel is None and settings.kv_cache_dtype == "auto" and placement.dtype in (torch.bfloat16, torch.float16):
            kv_dtype = torch.float32
        elif (
            kernel is not None
            and settings.kv_cache_dtype == "auto"
            and placement.dtype == torch.float32
            and quant.int8_activations
        ):
            # W8A8 rounds every product's input to 8 bits; keys and values kept to bfloat16's 8
            # bits of mantissa cost nothing measurable on top (docs/quantization.md) and halve
            # what decode attention reads a step.
            kv_dtype = torch.bfloat16
    if settings.kv_cache_dtype == "bfloat16":
        kv_dtype = _narrow_kv_dtype(cpu_text, placement.dtype)
    weights = StageReporter(WEIGHTS)
    dtype_name = str(placement.dtype).removeprefix("torch.")
    weights.begin(f"{folder.name}, {dtype_name}")
    try:
        with weight_progress(weights.progress):
            base = model_class.from_pretrained(
                str(folder), dtype=placement.dtype, local_files_only=True, trust_remote_code=remote, **extra
            )
        base, info = base if isinstance(base, tuple) else (base, {})  # output_loading_info: (model, info)
        base.to(placement.device)  # type: ignore[arg-type]  # transformers' typed wrapper of nn.Module.to
        if quant.quantized:
            quantize_model(base, quant, folder, info, placement.dtype, placement.device)
    except QuantizationError as exc:
        weights.failed(f"{folder.name}: {exc}")
        raise ModelLoadError(str(exc)) from exc
    except BaseException as exc:
        weights.failed(f"{folder.name}: {(str(exc).splitlines() or [type(exc).__name__])[0]}")
        raise
    weights.end(f"{folder.name}, {dtype_name}, {_size(_weight_bytes(base))}")
    base.eval()
    model = attach_adapters(base, adapters)
    fast = None
    # The CPU speed paths rewrite the linear layers, which hold a rank's shard under tensor parallel.
    if settings.cpu_prepack_weights and world == 1 and prepack_supported(placement.device, placement.dtype):
        bf16 = build_bf16_gemm() if placement.dtype == torch.bfloat16 else None
        pack_linears(model, base.get_decoder(), base.get_output_embeddings(), bf16)
        if cpu_text and not adapters:
            attend = InvariantAttend(invariant) if invariant is not None else None
            norms = build_norm_kernel() if kernel is not None and invariant is None else None
            if norms is not None:
                # Before the lean step takes the modules: both forwards must run the same norms.
                fuse_norms(base.get_decoder(), norms)
            rope = build_rope_kernel() if norms is not None else None
            prompt = build_prompt_kernel() if norms is not None else None
            silu = build_silu_kernel(placement.dtype) if norms is not None else None
            if silu is not None:
                fuse_silu(base.get_decoder(), silu)  # as the norms: the lean step runs the same SiLU
            # None where it would not equal the model's forward.
            fast = FastDecoder.build(base, kernel, attend, rope, prompt, silu)
    if invariant is not None:
        install_batch_invariant(model, base.get_decoder(), base.get_output_embeddings())
    draft = None
    if settings.speculative_model:
        try:
            draft = load_draft(settings.speculative_model, tokenizer, placement.device, placement.dtype, remote)
        except DraftLoadError as exc:
            raise ModelLoadError(str(exc)) from exc
    text_config = base.config.get_text_config(decoder=True)
    vocab_size = int(getattr(text_config, "vocab_size", 0) or len(tokenizer))
    eos = _as_ids(gen.get("eos_token_id")) | _as_ids(config.get("eos_token_id"))
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    context = int(getattr(text_config, "max_position_embeddings", 0) or 0) or 2048
    # The copies to the device are asynchronous: wait, so that the load time is true and the free
    # memory the KV budget is sized from no longer counts the weights still on their way.
    synchronize(placement.device)
    kv_note = f", keys/values {str(kv_dtype).removeprefix('torch.')}" if kv_dtype is not None else ""
    logger.info(
        "loaded %s (%s, %s%s) in %.1f s",
        folder.name,
        placement.device,
        placement.dtype,
        kv_note,
        time.monotonic() - started,
    )
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        device=placement.device,
        dtype=placement.dtype,
        eos_token_ids=frozenset(eos),
        context_length=context,
        vocab_size=vocab_size,
        defaults=_sampling_defaults(gen, config, vocab_size),
        name=settings.served_model_name or folder.name,
        model_type=model_type,
        base_model=base,
        adapters=frozenset(adapters),
        media=MediaProcessor.from_folder(folder, model_type, tokenizer),
        kv_dtype=kv_dtype,
        fast_decoder=fast,
        row_argmax=argmax.first_max if argmax is not None else None,
        tensor_parallel_size=world,
        draft=draft,
        seeds=seed_source(settings.seed),
    )
