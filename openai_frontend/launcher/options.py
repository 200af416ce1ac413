"""What the ``triton-chat`` subcommands were asked to do, and how that becomes settings.

Owns the parsed-options dataclasses (``ServeOptions``, ``FrontendOptions``, ``RepositoryOptions``,
``TritonServerArgs``, ``TlsFiles``), the
mapping from options to the model's ``EngineSettings``, to the frontend's settings (``http_settings``)
and to uvicorn's TLS arguments. Parsing
itself is in ``cli.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from openai_frontend.launcher.log_format import DEFAULT_LOG_LEVEL
from openai_frontend.launcher.log_rotation import DEFAULT_MAX_MB
from openai_frontend.launcher.supervisor import MAX_RESTARTS
from openai_frontend.launcher.triton_endpoints import TritonListen
from openai_frontend.media.policy import MediaSettings
from openai_frontend.settings import HttpLimits
from python_backend.protocol.settings import EngineSettings


@dataclass(frozen=True)
class TlsFiles:
    cert: str
    key: str
    client_ca: str | None  # set: clients must present a certificate signed by it (mTLS)


@dataclass(frozen=True)
class OperationsOptions:
    """The operations flags both commands share; each field is the ``FrontendSettings`` field of
    the same name (CORS, SSE keep-alive, log format)."""

    allowed_origins: tuple[str, ...] = ()
    allowed_methods: tuple[str, ...] = ()
    allowed_headers: tuple[str, ...] = ()
    allow_credentials: bool = False
    sse_keepalive_s: float = 0.0
    log_format: str = "text"


@dataclass(frozen=True)
class ServeOptions:
    """Everything ``triton-chat serve`` was asked to do."""

    model: Path | None  # local Hugging Face folder; None: the SmolLM2 demo model
    served_model_name: str | None  # None: the folder's name (or the demo's name)
    host: str
    port: int
    allow_external: bool
    engine_overrides: dict[str, int]  # EngineSettings integer fields given on the command line
    engine_flags: dict[str, str | bool]  # the other EngineSettings fields with a flag (engine_flags.py)
    lora_modules: dict[str, str]  # adapter name -> local PEFT adapter folder (MindIE LoraModules)
    openai_mode: str
    full_text: bool
    api_keys: tuple[str, ...]
    strict_params: bool
    ready_timeout_s: float
    triton_log: Path | None  # None: <cache>/logs/tritonserver-<port>.log
    triton_log_max_mb: int = DEFAULT_MAX_MB  # rotate tritonserver's log past this (0: never)
    tls: TlsFiles | None = None  # HTTPS for the frontend
    drain_timeout_s: float = 0.0  # SIGTERM: seconds requests in flight get to finish (0: stop at once)
    token_timeout_s: float = 600.0  # FrontendSettings.token_timeout_s (MindIE tokenTimeout)
    e2e_timeout_s: float = 600.0  # FrontendSettings.request_timeout_s (MindIE e2eTimeout)
    max_restarts: int = MAX_RESTARTS  # tritonserver restarts allowed in 10 minutes (supervisor.py)
    response_channel: bool = True  # FrontendSettings.response_channel
    http_limits: HttpLimits = HttpLimits()  # FrontendSettings' header, body and connection limits
    operations: OperationsOptions = field(default_factory=OperationsOptions)
    model_origin: str = "--model"  # where the model folder was named, for error messages
    device_origin: str = "--device"
    dtype_origin: str = "--dtype"
    metrics_vllm_names: bool = False  # FrontendSettings.metrics_vllm_names
    triton_listen: TritonListen = field(default_factory=TritonListen)  # tritonserver's listeners
    instances: int | None = None  # instance_group count; None: config.pbtxt's
    log_level: str = DEFAULT_LOG_LEVEL  # the launcher's, uvicorn's and the frontend's (log_format.py)
    media_root: str | None = None  # MediaSettings.media_root (file:// media); None: its default

    @property
    def dtype(self) -> str:
        return str(self.engine_flags["dtype"])

    @property
    def device(self) -> str:
        return str(self.engine_flags["device"])


@dataclass(frozen=True)
class FrontendOptions:
    """Everything ``triton-chat frontend`` was asked to do."""

    triton_url: str
    triton_model: str
    served_model_name: str
    host: str
    port: int
    openai_mode: str
    full_text: bool
    api_keys: tuple[str, ...]
    strict_params: bool
    tls: TlsFiles | None = None
    drain_timeout_s: float = 0.0  # SIGTERM: seconds requests in flight get to finish (0: stop at once)
    token_timeout_s: float = 600.0  # FrontendSettings.token_timeout_s (MindIE tokenTimeout)
    e2e_timeout_s: float = 600.0  # FrontendSettings.request_timeout_s (MindIE e2eTimeout)
    response_channel: bool = True  # FrontendSettings.response_channel
    http_limits: HttpLimits = HttpLimits()  # FrontendSettings' header, body and connection limits
    operations: OperationsOptions = field(default_factory=OperationsOptions)
    metrics_vllm_names: bool = False  # FrontendSettings.metrics_vllm_names
    triton_metrics_url: str = ""  # Triton's /metrics, read for the engine's gauges ("": none)
    log_level: str = DEFAULT_LOG_LEVEL  # the launcher's, uvicorn's and the frontend's (log_format.py)
    media_root: str | None = None  # MediaSettings.media_root (file:// media); None: its default


@dataclass(frozen=True)
class RepositoryOptions:
    """Everything ``triton-chat repository`` was asked to do."""

    dest: Path  # the model repository folder; the model goes into dest/triton_chat
    model: Path | None  # None: the demo model
    model_origin: str  # where the model folder was named, for error messages
    served_model_name: str | None
    engine_flags: dict[str, str | bool]
    engine_overrides: dict[str, int]
    lora_modules: dict[str, str]
    instances: int  # instance_group count: one engine per instance


@dataclass(frozen=True)
class TritonServerArgs:
    """``triton-chat tritonserver ARGS...``: ARGS go to tritonserver as they are."""

    args: list[str]


def uvicorn_tls(tls: TlsFiles | None) -> dict[str, Any]:
    """uvicorn.Config keyword arguments for HTTPS (and mutual TLS when a client CA is given)."""
    if tls is None:
        return {}
    import ssl

    options: dict[str, Any] = {"ssl_certfile": tls.cert, "ssl_keyfile": tls.key}
    if tls.client_ca:
        options.update(ssl_ca_certs=tls.client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options


def engine_settings(options: ServeOptions, model_dir: Path, served_model_name: str) -> EngineSettings:
    """The model's settings for these options (raises ``SettingsError`` naming a bad value)."""
    values: dict[str, Any] = {**options.engine_flags, **options.engine_overrides}
    if values.get("speculative_model"):
        # Absolute, as the model's folder: the stub does not run in the launcher's directory.
        values["speculative_model"] = str(Path(str(values["speculative_model"])).expanduser().resolve())
    return EngineSettings(
        # Absolute: tritonserver and its stub do not share the launcher's working directory.
        model_path=str(model_dir.expanduser().resolve()),
        served_model_name=served_model_name,
        lora_modules=json.dumps(options.lora_modules) if options.lora_modules else "",
        **values,
    )


def media_settings(options: ServeOptions | FrontendOptions, environ: Mapping[str, str]) -> MediaSettings:
    """The frontend's media policy: the remote allow-list from the environment, as in MindIE (read
    at start-up), and the local media folder from ``--allowed-local-media-path``."""
    root = {"media_root": options.media_root} if options.media_root else {}
    return MediaSettings.from_env(environ, **root)


def http_settings(options: ServeOptions | FrontendOptions) -> dict[str, Any]:
    """The ``FrontendSettings`` values that come from the HTTP flags both commands share."""
    return {
        "openai_mode": options.openai_mode,
        "full_text_enabled": options.full_text,
        "strict_params": options.strict_params,
        "api_keys": list(options.api_keys),
        "token_timeout_s": options.token_timeout_s,
        "request_timeout_s": options.e2e_timeout_s,
        "response_channel": options.response_channel,
        **asdict(options.http_limits),
        **{
            name: list(value) if isinstance(value, tuple) else value
            for name, value in asdict(options.operations).items()
        },
        "metrics_vllm_names": options.metrics_vllm_names,
    }
