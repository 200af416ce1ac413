"""Running the model repository under a tritonserver of the user's own: two commands.

``triton-chat repository DIR`` writes a model repository for a model folder (``model_path`` and
every engine setting filled in from the flags; the demo model, converted once, when no
``--model`` is given). ``triton-chat tritonserver ARGS...`` runs tritonserver with ARGS as given,
prepared as ``serve`` prepares it: the binary on PATH or the pip wheel's, with the Python
backend and this Python's stub in place (``--backend-directory``), this Python's ``python3``
first on PATH and its libraries on LD_LIBRARY_PATH (the stub embeds the Python it finds there),
``python_backend`` importable, and tritonserver's CPU-machine noise (NVML, DCGM) left out of
its output. Everything else (ports, addresses, other models in the repository) is the user's.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from openai_frontend.launcher.cache import cache_root
from openai_frontend.launcher.demo_model import DEMO_DTYPE, DEMO_SERVED_NAME, ensure_demo_model
from openai_frontend.launcher.dtype_check import check_dtype, checkpoint_torch_dtype
from openai_frontend.launcher.model_check import check_device, check_model_folder, model_folder
from openai_frontend.launcher.model_repo import MODEL_NAME, backend_python_path, write_model_repository
from openai_frontend.launcher.options import RepositoryOptions
from openai_frontend.launcher.tied_child import tied_popen
from openai_frontend.launcher.triton_install import TritonInstall, locate_tritonserver
from openai_frontend.launcher.triton_log import is_noise
from python_backend.protocol.settings import EngineSettings

logger = logging.getLogger("openai_frontend.launcher")

BACKEND_DIRECTORY_FLAG = "--backend-directory"


@dataclass(frozen=True)
class TritonCommand:
    """The tritonserver command line and environment ``triton-chat tritonserver`` runs."""

    argv: list[str]
    env: dict[str, str]


def write_repository(options: RepositoryOptions) -> Path:
    """Write ``dest/triton_chat`` for the options' model; the model folder it serves."""
    target = options.dest / MODEL_NAME
    if target.exists():
        raise FileExistsError(f"{target} already exists; remove it or give another folder")
    device = str(options.engine_flags.get("device", "auto"))
    check_device(device)
    given = (
        check_model_folder(model_folder(options.model, options.model_origin, options.engine_flags))
        if options.model
        else None
    )
    checkpoint = checkpoint_torch_dtype(given) if given is not None else DEMO_DTYPE
    check_dtype(str(options.engine_flags.get("dtype", "auto")), device, checkpoint)
    if given is not None:
        model_dir = given
        served_name = options.served_model_name or model_dir.name
    else:
        model_dir = ensure_demo_model(cache_root(), logger.info)
        served_name = options.served_model_name or DEMO_SERVED_NAME
    settings = EngineSettings(
        # Absolute: tritonserver's working directory is not this one.
        model_path=str(model_dir),
        served_model_name=served_name,
        lora_modules=json.dumps(options.lora_modules) if options.lora_modules else "",
        **{**options.engine_flags, **options.engine_overrides},  # type: ignore[arg-type]
    )
    write_model_repository(options.dest, settings, instances=options.instances)
    return model_dir


def tritonserver_command(install: TritonInstall, args: list[str]) -> TritonCommand:
    """``args`` for ``install``'s binary, with the backend folder unless the user named one."""
    argv = [str(install.server), *args]
    given = any(arg == BACKEND_DIRECTORY_FLAG or arg.startswith(BACKEND_DIRECTORY_FLAG + "=") for arg in args)
    if install.backend_dir is not None and not given:
        argv += [BACKEND_DIRECTORY_FLAG, str(install.backend_dir)]
    env = install.environment()
    env.update(backend_python_path())
    env.setdefault("HF_HUB_OFFLINE", "1")  # models are local folders; never download at run time
    return TritonCommand(argv, env)


def run_tritonserver(args: list[str]) -> int:
    """Run tritonserver in the foreground until it exits; its exit status."""
    command = tritonserver_command(locate_tritonserver(cache_root()), args)
    logger.info("running %s", " ".join(command.argv))
    # SIGTERM when this launcher dies, even by SIGKILL: a killed ``triton-chat tritonserver``
    # leaves no server behind.
    proc = tied_popen(
        command.argv,
        signal.SIGTERM,
        env=command.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )

    def forward(signum: int, frame: FrameType | None) -> None:
        # tritonserver shuts down in order on SIGINT/SIGTERM; its exit ends the loop below.
        proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert proc.stdout is not None  # stdout=PIPE above
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace")
            if not is_noise(line):
                sys.stdout.write(line)
                sys.stdout.flush()
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
