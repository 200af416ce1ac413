"""The HTTP frontend's command-line flags, shared by ``triton-chat serve`` and ``triton-chat frontend``.

Owns: declaring them on an argument group (``add_http_flags``), the checks across them
(``check_http_flags``: exposure without ``--allow-external``, TLS files, the drain and request
timeouts, the HTTP limits, the local media folder) and gathering the HTTP limits
(``http_limits``). The flags of ``FrontendSettings`` fields are generated from their ``FlagInfo``
and description (``frontend_flags``); those of the listener itself (address, TLS under vLLM's
``--ssl-*`` names, drain, log level, local media folder) are the launcher's own and declared here.
Every flag's help says its default.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from openai_frontend.launcher.log_format import DEFAULT_LOG_LEVEL, LOG_LEVELS
from openai_frontend.launcher.network import is_loopback
from openai_frontend.launcher.options import OperationsOptions
from openai_frontend.media.policy import MediaSettings
from openai_frontend.settings import FlagInfo, FrontendSettings, HttpLimits, flag_info

DEFAULT_DRAIN_TIMEOUT_S = 30.0  # as tritonserver's --exit-timeout-secs
API_KEY_ENV = "TRITON_CHAT_API_KEY"  # the key, kept off the command line
DEFAULT_MEDIA_ROOT = str(MediaSettings.model_fields["media_root"].default)


def with_default(help_text: str, default: str) -> str:
    """``help_text`` ending in ``(default: ...)``, unless it already says its default."""
    said = any(words in help_text for words in ("(default: ", "; default: ", "(default)"))
    return help_text if said else f"{help_text} (default: {default})"


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0 (also the engine's integer flags, in cli.py)."""
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an integer: '{text}'") from exc
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _port(text: str) -> int:
    value = non_negative_int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 1-65535, got {value}")
    return value


def add_http_flags(http: Any) -> None:
    """The frontend's flags, on an argument group of either command."""
    http.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    http.add_argument("--port", type=_port, default=8000, help="port to listen on (default: 8000)")
    http.add_argument(
        "--allow-external",
        action="store_true",
        help="allow a --host other machines can reach (use with --api-key) (default: off)",
    )
    # vLLM's names first; --tls-* are this launcher's older names of the same flags.
    http.add_argument(
        "--ssl-certfile",
        "--tls-cert",
        dest="tls_cert",
        metavar="PEM",
        help="serve HTTPS with this certificate (needs --ssl-keyfile) (default: none, plain HTTP)",
    )
    http.add_argument(
        "--ssl-keyfile",
        "--tls-key",
        dest="tls_key",
        metavar="PEM",
        help="the certificate's private key (default: none)",
    )
    http.add_argument(
        "--ssl-ca-certs",
        "--tls-ca-cert",
        dest="tls_ca_cert",
        metavar="PEM",
        help="require client certificates signed by this CA (mTLS) (default: none, no client certificates)",
    )
    http.add_argument(
        "--allowed-local-media-path",
        default=DEFAULT_MEDIA_ROOT,
        metavar="DIR",
        help="the folder file:// media parts are read from; nothing outside it (default: %(default)s)",
    )
    http.add_argument(
        "--log-level",
        "--uvicorn-log-level",
        choices=LOG_LEVELS,
        default=DEFAULT_LOG_LEVEL,
        metavar="LEVEL",
        help=f"{', '.join(LOG_LEVELS)}: the launcher's, uvicorn's and the frontend's log level (the frontend's "
        "per-request info lines show only at debug) (default: %(default)s)",
    )
    http.add_argument(
        "--drain-timeout",
        type=float,
        default=DEFAULT_DRAIN_TIMEOUT_S,
        metavar="S",
        help="on SIGTERM, refuse new requests (503) and let those in flight finish for up to S seconds "
        f"before stopping (default: {DEFAULT_DRAIN_TIMEOUT_S:.0f}; 0: stop at once)",
    )
    for _, spec, info in frontend_flags():
        http.add_argument(info.flag, **_flag_arguments(spec, info))


def frontend_flags() -> list[tuple[str, FieldInfo, FlagInfo]]:
    """``FrontendSettings`` fields that are launcher flags: (field name, its pydantic field, its flag)."""
    found = []
    for name, spec in FrontendSettings.model_fields.items():
        info = flag_info(name)
        if info is not None:
            found.append((name, spec, info))
    return found


def _flag_arguments(spec: FieldInfo, info: FlagInfo) -> dict[str, Any]:
    arguments: dict[str, Any] = {"dest": info.dest, "help": spec.description}
    if spec.annotation is bool:
        # A flag turns the setting away from its default: --no-X for those on by default.
        arguments["action"] = "store_false" if spec.default else "store_true"
        if spec.default:
            arguments["help"] = f"turn off {spec.description} (default: on)"
        else:
            arguments["help"] = with_default(str(spec.description), "off")
    elif spec.annotation == list[str]:
        repeatable = "" if "repeatable" in str(spec.description) else "repeatable; "
        arguments.update(action="append", default=[], help=f"{spec.description} ({repeatable}default: none)")
    else:
        arguments.update(type=spec.annotation, default=spec.default)
        if spec.annotation in (float, int):
            arguments["help"] = f"{spec.description} (default: {spec.default:g})"
        else:
            arguments["help"] = with_default(str(spec.description), str(spec.default))
    if info.choices:
        arguments["choices"] = info.choices
    if info.metavar:
        arguments["metavar"] = info.metavar
    return arguments


def http_limits(args: argparse.Namespace) -> HttpLimits:
    """The HTTP layer's limits from the parsed flags: each ``HttpLimits`` field is the
    ``FrontendSettings`` field of the same name, given by that field's flag."""
    dests = {name: info.dest for name, _, info in frontend_flags()}
    return HttpLimits(**{spec.name: getattr(args, dests[spec.name]) for spec in fields(HttpLimits)})


def operations_options(args: argparse.Namespace) -> OperationsOptions:
    """The operations flags' values (``OperationsOptions`` fields are ``FrontendSettings`` fields)."""
    return OperationsOptions(
        allowed_origins=tuple(args.allowed_origins),
        allowed_methods=tuple(args.allowed_methods),
        allowed_headers=tuple(args.allowed_headers),
        allow_credentials=args.allow_credentials,
        sse_keepalive_s=args.sse_keepalive,
        log_format=args.log_format,
    )


def api_keys_with_environment(keys: list[str], environ: Mapping[str, str]) -> list[str]:
    """The ``--api-key`` values, else the key in ``API_KEY_ENV`` (as vLLM's ``VLLM_API_KEY``): other
    local users can read a command line, never another user's environment."""
    if keys:
        return keys
    value = environ.get(API_KEY_ENV, "")
    return [value] if value else []


def check_http_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Checks across the frontend's flags; a failure exits with status 2, like argparse's own."""
    if not is_loopback(args.host) and not args.allow_external:
        parser.error(
            f"--host {args.host} would let other machines reach the server; "
            "add --allow-external to confirm (and consider --api-key)"
        )
    if args.served_model_name is not None and not args.served_model_name.strip():
        parser.error("--served-model-name must not be empty")
    if any(not key for key in args.api_keys):
        parser.error("--api-key must not be empty")
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--ssl-certfile and --ssl-keyfile (--tls-cert, --tls-key) go together")
    if args.drain_timeout < 0:
        parser.error("--drain-timeout must be >= 0")
    for flag in (
        "token_timeout",
        "e2e_timeout",
        "header_timeout",
        "body_timeout",
        "max_header_bytes",
        "max_headers",
        "max_connections",
    ):
        if not getattr(args, flag) > 0:  # also refuses nan
            parser.error(f"--{flag.replace('_', '-')} must be > 0, got {getattr(args, flag)}")
    if not args.sse_keepalive >= 0:
        parser.error(f"--sse-keepalive must be >= 0, got {args.sse_keepalive}")
    if args.allow_credentials and "*" in args.allowed_origins:
        parser.error("--allow-credentials needs named --allowed-origins, not '*'")
    for flag in ("allowed_origins", "allowed_methods", "allowed_headers"):
        if any(not item.strip() for item in getattr(args, flag)):
            parser.error(f"--{flag.replace('_', '-')} must not be empty")
    if args.tls_ca_cert and not args.tls_cert:
        parser.error("--ssl-ca-certs needs --ssl-certfile and --ssl-keyfile")
    for flag, shown in (
        ("tls_cert", "--ssl-certfile"),
        ("tls_key", "--ssl-keyfile"),
        ("tls_ca_cert", "--ssl-ca-certs"),
    ):
        if getattr(args, flag) and not Path(getattr(args, flag)).is_file():
            parser.error(f"{shown}: '{getattr(args, flag)}' is not a file")
    args.allowed_local_media_path = _media_root(parser, args.allowed_local_media_path)


def _media_root(parser: argparse.ArgumentParser, given: str) -> str:
    """The local media folder, absolute; one named on the command line must exist (the built-in
    default, MindIE's, may not: file:// parts then fail as missing files)."""
    if given == DEFAULT_MEDIA_ROOT:
        return given
    folder = Path(given).expanduser()
    if not folder.is_dir():
        parser.error(f"--allowed-local-media-path: '{given}' is not a folder")
    return str(folder.resolve())
