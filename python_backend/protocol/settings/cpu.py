"""CPU settings: prepacked products, native kernels, thread binding and tuning, the heap policy,
the keys' and values' dtype and the batch-invariant mode.
"""

from __future__ import annotations

from dataclasses import dataclass

from python_backend.protocol.settings.info import KV_CACHE_DTYPE_CHOICES, SettingInfo, setting


@dataclass(frozen=True)
class CpuSettings:
    """CPU speed paths, threads and memory; the KV dtype; batch invariance."""

    cpu_prepack_weights: bool = setting(
        True,
        SettingInfo(
            "on CPU, keep linear weights in PyTorch's layout instead of a packed one (about 2x slower)",
            flag="--no-cpu-prepack-weights",
            docs="CPU: pack float32/bfloat16 linear weights once, in oneDNN's blocked layout or, in bfloat16 on "
            "AVX512-BF16 CPUs without AMX, our own kernel's (about 2x faster linear layers)",
        ),
    )
    cpu_native_attention: bool = setting(
        True,
        SettingInfo(
            "on CPU, do not build the C decode-attention and RMSNorm kernels for bfloat16 and float32 models "
            "(PyTorch's are slower)",
            flag="--no-cpu-native-attention",
            docs="CPU, bfloat16 and float32 text models: build the C decode-attention kernel with the machine's C "
            "compiler (once, into `<cache>/native/`) and use it, and for Llama/Qwen2 models the one-pass RMSNorm "
            "(with the residual add before it), rotary and SiLU kernels and, where every part is native, a "
            "decode step's layers in one call, and greedy sampling's argmax; without a compiler the engine logs "
            "it and uses PyTorch's",
        ),
    )
    # Off by default: it made no difference beyond the noise on a 2-core machine, and two model
    # instances on one host would pin to the same cores.
    cpu_bind_threads: bool = setting(
        False,
        SettingInfo(
            "on CPU, pin the engine's compute threads one per physical core (the stub's other threads to the first)",
            flag="--cpu-bind-threads",
            docs="CPU: pin the engine's compute threads one per physical core of the CPUs the process may "
            "use (as vLLM's `VLLM_CPU_OMP_THREADS_BIND`), and the Triton stub's other threads to the first "
            "of them. Off by default: no difference beyond the noise on the 2-core test machine "
            "(at 16 streams, 334-377 tok/s over 8 pinned runs against 316-363 over 5 unpinned), and two model instances on one host would pin to the same "
            "cores. Skipped with fewer cores than threads or without a C compiler",
        ),
    )
    # On by default: alone it keeps the full team (a probe costs a few steps every few seconds),
    # and beside a busy process it is what keeps the engine from running at the pace of a
    # preempted thread.
    cpu_adaptive_threads: bool = setting(
        True,
        SettingInfo(
            "on CPU, keep the engine's compute thread count fixed instead of following the CPU available",
            flag="--no-cpu-adaptive-threads",
            docs="CPU: every few seconds under load, time decode steps with one compute thread fewer (or "
            "more, up to `torch_threads`) and keep the faster count, so that a busy process on one of the "
            "cores costs that core, not the whole team's pace; the count in use is the "
            "`triton_chat_compute_threads` gauge",
        ),
    )
    # On by default: fewer page faults and less system time under load (docs/performance.md),
    # and an idle server still gives its memory back.
    cpu_keep_freed_memory: bool = setting(
        True,
        SettingInfo(
            "on CPU, let glibc return freed memory to the system at once (its defaults)",
            flag="--no-cpu-keep-freed-memory",
            docs="CPU: have glibc's allocator in the model's process serve blocks up to 32 MiB from its heap and "
            "keep freed memory while requests run, so that the buffers a step allocates again and again do "
            "not fault in fresh pages each time; what it kept goes back to the system when the engine goes "
            "idle. Nothing changes where the environment already sets `MALLOC_*_` variables or `glibc.malloc` "
            "tunables",
        ),
    )
    # 512 MiB: a C=64 burst's buffers on the demo model fit (the faults saved stay saved), and a
    # spike's peak is not held while requests keep coming (it was 2.2 GB until the next idle).
    cpu_keep_freed_memory_mb: int = setting(
        512,
        SettingInfo(
            "on CPU, freed memory the model's process keeps resident for reuse at most, in MiB",
            flag="--cpu-keep-freed-memory-mb",
            minimum=1,
            metavar="MB",
            docs="CPU, with `cpu_keep_freed_memory`: the most freed memory the model's process keeps "
            "resident while requests run. glibc trims its heap's top above it, and at most once a second "
            "between steps the engine gives the free memory inside the heap back (`malloc_trim`) once what "
            "is resident beyond what is in use passes it, so a load spike is not held until the next idle",
        ),
    )
    # auto keeps float32 keys/values for a 16-bit text model on CPU without the C kernel:
    # PyTorch's decode attention is 2-5x faster that way, for twice the KV memory. bfloat16 halves
    # a float32 model's KV bytes, which decode attention reads from DRAM every step; auto takes it
    # where the products are W8A8, whose 8-bit inputs lose far more than bfloat16 keys do.
    kv_cache_dtype: str = setting(
        "auto",
        SettingInfo(
            "auto: the model's dtype, or float32 for a 16-bit model on CPU without the C kernel, or bfloat16 for "
            "a float32 model with W8A8 layers on CPU; model: its dtype; bfloat16: CPU, keys/values of a float32 "
            "model stored in bfloat16",
            flag="--kv-cache-dtype",
            choices=KV_CACHE_DTYPE_CHOICES,
            docs="`auto`: the model's dtype, except that a 16-bit text model on CPU without the C attention "
            "kernel keeps float32 keys/values (faster PyTorch attention, twice the memory), and a float32 text "
            "model on CPU whose layers are W8A8 (a W8A8 folder, `--quantization int8`) keeps them in bfloat16, "
            "as `bfloat16` below (its products round every input to 8 bits, which costs far more than "
            "bfloat16 keys and values, [quantization.md](quantization.md#quality)); `model`: always "
            "the model's dtype; `bfloat16` (text models on CPU): a float32 model's keys and values are "
            "rounded to bfloat16 when they are stored, prompts and prefix cache included, and attention reads "
            "them widened back: half the KV memory and half the bytes each decode step reads, for outputs "
            "that differ from `auto`'s within bfloat16 rounding",
        ),
    )
    # Off by default: it costs throughput (docs/performance.md) that most deployments would rather have.
    batch_invariant: bool = setting(
        False,
        SettingInfo(
            "CPU: greedy output that does not depend on the batch, the prefix cache or chunking (slower)",
            flag="--batch-invariant",
            docs="CPU, float32/bfloat16 text models: every matrix product runs a fixed number of rows at a "
            "time and one attention kernel serves prefill and decode with a fixed order of additions, so a "
            "request's logits are bit-identical alone, in any batch, cold or from the prefix cache, chunked "
            "or not (greedy output repeats exactly); costs throughput, see [performance](performance.md). "
            "Needs a C compiler",
        ),
    )
