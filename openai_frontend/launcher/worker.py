"""``triton-chat worker``: a node other than node 0 of one model spread over several nodes.

Owns ``WorkerOptions`` and ``run_worker``. The node runs no tritonserver and no HTTP frontend
(vLLM's ``--headless``): after the same checks ``serve`` makes (the model folder, the device), it
becomes the node's rank keeper (``python -m python_backend.parallel.node``, by exec, so this
process's id and signals are the keeper's), whose ranks join rank 0 at ``--master-addr:--master-port``
and join again each time node 0's model starts.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from openai_frontend.launcher.cache import cache_root
from openai_frontend.launcher.demo_model import DemoModelError, ensure_demo_model
from openai_frontend.launcher.model_check import ModelFolderError, check_device, check_model_folder, model_folder
from openai_frontend.launcher.model_repo import backend_python_path
from python_backend.protocol.settings import EngineSettings, SettingsError

logger = logging.getLogger(__name__)

NODE_MODULE = "python_backend.parallel.node"


@dataclass(frozen=True)
class WorkerOptions:
    """Everything ``triton-chat worker`` (or ``serve --headless``) was asked to do."""

    model: Path | None  # None: the demo model, as serve
    values: dict[str, str | bool | int]  # the engine settings given, by field name


def worker_settings(options: WorkerOptions, model_dir: Path) -> EngineSettings:
    """The node's settings (raises ``SettingsError`` naming a bad value)."""
    return EngineSettings(model_path=str(model_dir.expanduser().resolve()), **options.values)  # type: ignore[arg-type]


def node_command(settings: EngineSettings) -> list[str]:
    """The rank keeper's command line for ``settings``."""
    return [sys.executable, "-m", NODE_MODULE, "--settings", json.dumps(settings.to_parameters())]


def run_worker(options: WorkerOptions) -> int:
    """Check what can be checked here, then become the node's rank keeper; 1 on a bad start."""
    try:
        if options.model is not None:
            model_dir = check_model_folder(model_folder(options.model, "--model", options.values))
        else:
            model_dir = ensure_demo_model(cache_root(), logger.info)
        settings = worker_settings(options, model_dir)
        check_device(settings.device)
    except (ModelFolderError, DemoModelError, SettingsError) as exc:
        logger.error("%s", exc)
        return 1
    logger.info(
        "node %d of %d: ranks %d-%d of %d join rank 0 at %s:%d",
        settings.node_rank,
        settings.nnodes,
        settings.first_rank,
        settings.first_rank + settings.ranks_per_node - 1,
        settings.tensor_parallel_size,
        settings.master_addr,
        settings.master_port,
    )
    env = {**os.environ, **backend_python_path(), "HF_HUB_OFFLINE": "1"}  # never download at run time
    sys.stderr.flush()
    command = node_command(settings)
    os.execve(command[0], command, env)
