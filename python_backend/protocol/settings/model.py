"""The model's engine settings: which model, served under which name, in which dtype, on which
devices, and how its output is parsed (tool calls, reasoning) and adapted (LoRA).
"""

from __future__ import annotations

from dataclasses import dataclass

from python_backend.protocol.settings.info import (
    DTYPES,
    REASONING_PARSER_CHOICES,
    TOOL_CALL_PARSER_CHOICES,
    SettingInfo,
    setting,
)


@dataclass(frozen=True)
class ModelSettings:
    """Which model, served as what, in which dtype, on which devices."""

    model_path: str = setting(
        "",
        SettingInfo(
            "local Hugging Face model folder (default: the SmolLM2-135M-Instruct demo model)",
            flag="--model",
            mindie_key="modelWeightPath",
            metavar="DIR",
            docs="local Hugging Face folder",
            docs_default="the demo model",
        ),
    )
    served_model_name: str = setting(
        "",
        SettingInfo(
            "the `model` name clients send (default: the folder's name)",
            flag="--served-model-name",
            mindie_key="modelName",
            metavar="NAME",
            docs="the `model` clients send; `/v1/models` lists it",
            docs_default="the folder's name",
        ),
    )
    dtype: str = setting(
        "auto",
        SettingInfo(
            "weights dtype (default: auto = the folder's torch_dtype)",
            flag="--dtype",
            mindie_key="dtype",
            choices=DTYPES,
            docs="`auto` (the checkpoint's; on CPU a float16 checkpoint runs in bfloat16, and a 16-bit one in "
            "float32 where the CPU has no bfloat16 kernels, as on AVX2-only x86), `bfloat16`, `float16`, `float32`",
        ),
    )
    # Quantized weights (docs/quantization.md): the folder's compressed-tensors config, int8 made at
    # load time from a 16/32-bit folder, or the 4-bit blocks of the GGUF file the folder came from.
    quantization: str = setting(
        "auto",
        SettingInfo(
            "auto: as the folder's quantization_config says (none without one); none: 16/32-bit "
            "weights only; int8: W8A8 made at load time from a 16/32-bit folder; gguf: the 4-bit "
            "blocks of the GGUF file the folder was converted from (the demo model)",
            flag="--quantization",
            mindie_key="quantize",
            choices=("auto", "none", "int8", "gguf"),
            docs="`auto`: a compressed-tensors folder (`quantization_config` in its `config.json`: W8A8 int8, "
            "W8A16, W4A16) keeps its quantized weights, any other folder loads as `dtype` says; `none`: "
            "refuse a quantized folder; `int8`: quantize a 16/32-bit folder's decoder to int8 at load time "
            "(per-channel weights, per-token dynamic activations); `gguf`: serve the Q4_0/Q4_1 blocks of the "
            "GGUF file a folder was converted from (the demo model) with the 4-bit kernel; see "
            "[quantization](quantization.md)",
        ),
    )
    # Off by default: vLLM and llm-compressor keep the head 16-bit, and the demo model's perplexity
    # rises by another point with it in int8 (docs/quantization.md); llama.cpp's Q8_0 quantizes it.
    quantize_lm_head: bool = setting(
        False,
        SettingInfo(
            "also make the output head (lm_head) W8A8 int8 at load time: per-channel weights, per-token "
            "dynamic activations",
            flag="--quantize-lm-head",
            docs="make the output head (`lm_head`; for tied embeddings a copy, the embeddings stay) W8A8 int8 at "
            "load time, per-channel weights and per-token dynamic activations, with any `quantization`: on CPU "
            "it reads a quarter of a float32 head's bytes a step, the decode step's largest product, at a cost "
            "in quality; see [quantization](quantization.md#the-output-head)",
        ),
    )
    device: str = setting(
        "auto",
        SettingInfo(
            "auto | cpu | cuda[:N] | npu[:N] (default: auto)",
            flag="--device",
            mindie_key="device",
            metavar="DEVICE",
            docs="`auto` (CUDA, else Ascend, else CPU), `cpu`, `cuda[:N]`, `npu[:N]`",
        ),
    )
    # One model over several devices: rank 0 is this process, the others are worker processes
    # it starts (python_backend.parallel); each holds a shard of the weights and of the KV cache.
    tensor_parallel_size: int = setting(
        1,
        SettingInfo(
            "devices (ranks) one model instance is split over; 1 = no tensor parallel",
            flag="--tensor-parallel-size",
            aliases=("-tp",),
            mindie_key="worldSize",
            minimum=1,
            metavar="N",
            docs="ranks the model's layers are split over (tensor parallel: attention heads and MLP "
            "columns per rank, one process per rank, gloo on CPU, NCCL on CUDA, HCCL on Ascend); "
            "see [tensor parallel](tensor-parallel.md)",
        ),
    )
    device_ids: str = setting(
        "",
        SettingInfo(
            "comma-separated device index of each rank, e.g. 0,1,2,3 (default: from --device's index up)",
            flag="--device-ids",
            mindie_key="npuDeviceIds",
            metavar="IDS",
            docs="CUDA/NPU index of each rank, comma-separated (`0,1,2,3`); in `config.json` also "
            "MindIE's list form (`[[0, 1, 2, 3]]`)",
            docs_default="the device's index, then the next ones",
        ),
    )
    # One model across several nodes (torch.distributed's launch names): node 0 serves, with rank
    # 0 listening at master_addr:master_port; every other node runs `triton-chat worker`, whose
    # ranks join there. tensor_parallel_size counts the ranks of all nodes, as in vLLM.
    nnodes: int = setting(
        1,
        SettingInfo(
            "nodes (machines) the tensor-parallel ranks are spread over; each runs "
            "tensor_parallel_size / nnodes of them",
            flag="--nnodes",
            env=("NNODES", "PET_NNODES", "GROUP_WORLD_SIZE"),
            minimum=1,
            metavar="N",
            docs="nodes the ranks are spread over, `tensor_parallel_size / nnodes` ranks each; node 0 runs "
            "`serve`, the others `triton-chat worker` (see [tensor parallel](tensor-parallel.md)); unset: "
            "`NNODES`, `PET_NNODES` or `GROUP_WORLD_SIZE` from the environment",
        ),
    )
    node_rank: int = setting(
        0,
        SettingInfo(
            "this node's index, 0 to nnodes - 1; node 0 runs serve, the others triton-chat worker",
            flag="--node-rank",
            env=("NODE_RANK", "GROUP_RANK", "PET_NODE_RANK"),
            minimum=0,
            metavar="R",
            docs="this node's index (0: the node that serves; the others run `triton-chat worker`); unset: "
            "`NODE_RANK`, `GROUP_RANK` or `PET_NODE_RANK`",
        ),
    )
    master_addr: str = setting(
        "",
        SettingInfo(
            "node 0's address the other nodes reach it at; rank 0 listens there for the ranks to join "
            "(needed with --nnodes > 1)",
            flag="--master-addr",
            env=("MASTER_ADDR", "PET_MASTER_ADDR"),
            metavar="HOST",
            docs="node 0's address the other nodes reach; its interface carries the ranks' traffic "
            "(needed with `nnodes` > 1); unset: `MASTER_ADDR` or `PET_MASTER_ADDR`",
            docs_default="one node: loopback",
        ),
    )
    master_port: int = setting(
        0,
        SettingInfo(
            "the TCP port rank 0 listens on at --master-addr for the ranks to join (needed with --nnodes > 1)",
            flag="--master-port",
            env=("MASTER_PORT", "PET_MASTER_PORT"),
            minimum=0,
            metavar="PORT",
            docs="the TCP port of rank 0's rendezvous at `master_addr` (needed with `nnodes` > 1); unset: "
            "`MASTER_PORT` or `PET_MASTER_PORT`",
            docs_default="one node: a free port",
        ),
    )


@dataclass(frozen=True)
class ModelOutputSettings:
    """How the model's output is parsed and adapted; the code it may run."""

    # auto: from the chat template (<tool_call>: hermes, [TOOL_CALLS]: mistral, Llama 3's JSON
    # call instructions or <|python_tag|>: llama3_json), chatglm3 for model_type chatglm, else
    # none (requests with tools are then refused).
    tool_call_parser: str = setting(
        "auto",
        SettingInfo(
            "tool-call format of the model's output (default: auto, from the chat template)",
            flag="--tool-call-parser",
            mindie_key="toolCallParser",
            choices=TOOL_CALL_PARSER_CHOICES,
            docs="`auto`, `hermes` (Qwen2.5), `chatglm3`, `llama3_json` (Llama 3.x), `mistral`, `none`",
        ),
    )
    # auto: think when the vocabulary or chat template has <think>; none: never split reasoning.
    reasoning_parser: str = setting(
        "auto",
        SettingInfo(
            "split <think> reasoning into reasoning_content (default: auto)",
            flag="--reasoning-parser",
            mindie_key="reasoningParser",
            choices=REASONING_PARSER_CHOICES,
            docs="`auto`, `think`, `none`",
        ),
    )
    # MindIE's LoraModules: a JSON object {"adapter name": "/local/peft/adapter/folder"}; a
    # request whose `model` is an adapter's name runs with that adapter.
    lora_modules: str = setting(
        "",
        SettingInfo(
            "LoRA adapters (PEFT folders) requests select with model=NAME: NAME=DIR or vLLM's JSON "
            '{"name": NAME, "path": DIR}, several after one flag or the flag repeated',
            flag="--lora-modules",
            aliases=("--lora-module",),
            metavar="NAME=DIR",
            docs="a LoRA adapter (PEFT folder) requests select with `model=NAME`; in `config.json`: "
            "`LoraModules` (below)",
            docs_default="none",
        ),
    )
    # ChatGLM3 and other `auto_map` models need it. Off by default: that code runs with the
    # server's rights.
    trust_remote_code: bool = setting(
        False,
        SettingInfo(
            "run Python code shipped in the model folder (needed by e.g. ChatGLM3); trusted folders only",
            flag="--trust-remote-code",
            mindie_key="trustRemoteCode",
            docs="run Python code shipped in the model folder (ChatGLM3 needs it); only for folders you trust",
        ),
    )
