"""``hearth serve``: load a model (or serve every library model, loaded on demand) over the OpenAI- and
Anthropic-compatible API with uvicorn, without Qt, under the thermal policy the app uses."""

from __future__ import annotations

import argparse
import ipaddress
import sys
from collections.abc import Callable

from ..backends import KV_TYPES

LOOPBACK_HOSTS = ("localhost",)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hearth serve",
                                description="Serve a GGUF model over OpenAI- and Anthropic-compatible HTTP APIs.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", metavar="GGUF", help="the model file to serve")
    which.add_argument("--library", action="store_true",
                       help="serve every model of Hearth's model library; a request loads the model it names "
                            "(503 with the reason when it does not fit in memory)")
    p.add_argument("--max-resident", type=int, default=1,
                   help="with --library: most models loaded at once, memory permitting (default 1)")
    p.add_argument("--data-dir", help="with --library: Hearth's data folder (default: the per-user one)")
    p.add_argument("--name", help="the model id clients send in 'model' (default: the file name without .gguf)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; any other needs --api-key)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--api-key", help="require this key (Authorization: Bearer KEY or x-api-key: KEY)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow browser requests from ORIGIN (CORS); repeat for more; off by default")
    p.add_argument("--backend", default="auto", choices=("auto", "numpy", "cpu", "mlx"), help="compute backend")
    p.add_argument("--n-ctx", type=int, default=None, help="context length in tokens")
    p.add_argument("--kv-type", choices=KV_TYPES, default=None, help="with a single model: the cpu backend's KV cache type, as llama.cpp's -ctk/-ctv: f16 (default), f32, or q8_0 (8-bit blocks: 47 %% less KV memory, logits within about 1 of llama.cpp's; see the README)")
    p.add_argument("--parallel", type=int, default=16, help="most sequences decoding together (default 16)")
    p.add_argument("--max-queue", type=int, default=64, help="most requests queued or running; more get 429")
    p.add_argument("--prefix-caches", type=int, default=4,
                   help="finished requests' KV caches kept for prompts that start the same (default 4)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a request may run (default 600)")
    p.add_argument("--thermal", default="balanced", choices=("performance", "balanced", "cool", "off"),
                   help="the app's thermal policy over the server's sequences (default balanced; off: fixed limits)")
    return p


def is_loopback(host: str) -> bool:
    """True for addresses only this computer can reach."""
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Raise ValueError when ``host`` is reachable from other computers and no API key is set."""
    if not is_loopback(host) and not api_key:
        raise ValueError(f"binding {host} exposes the server to other computers: set --api-key")


def thermal_monitor(mode: str, parallel: int):
    """The app's thermal monitor and policy in ``mode``, its levels scaled so that a cool machine decodes
    ``parallel`` sequences together; None for "off"."""
    if mode == "off":
        return None
    import dataclasses

    from ..thermal import DEFAULT_LEVELS, Mode, PolicyConfig, ThermalMonitor, ThermalPolicy, default_provider
    nominal = DEFAULT_LEVELS[0].max_batch
    levels = tuple(dataclasses.replace(level, max_batch=max(1, level.max_batch * parallel // nominal))
                   for level in DEFAULT_LEVELS)
    return ThermalMonitor(default_provider(), ThermalPolicy(PolicyConfig(levels=levels), Mode(mode)))


def main(argv: list[str], library: Callable[[str | None], dict[str, str]] | None = None) -> int:
    """Run ``hearth serve``; ``library`` (given by ``hearth``, which knows the model library) maps a data folder
    to the library's models by id, for ``--library``."""
    args = parser().parse_args(argv)
    try:
        check_bind(args.host, args.api_key)
        if args.library and library is None:
            raise ValueError("--library needs Hearth's model library: run it as `hearth serve --library`")
        if args.library and args.kv_type is not None:
            raise ValueError("--kv-type applies to a single model; --library loads every model with its default cache")
    except ValueError as e:
        print(f"hearth serve: {e}", file=sys.stderr)
        return 2
    import uvicorn

    from .app import create_app

    served = _served(args, library)
    app = create_app(served, api_key=args.api_key, allowed_origins=tuple(args.allow_origin))
    print(f"serving {', '.join(served.host.model_ids()) or 'no models'} at http://{args.host}:{args.port}/v1",
          file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)
    return 0


def _served(args: argparse.Namespace, library: Callable[[str | None], dict[str, str]] | None):
    from ..model import load
    from .host import SchedulerThread, ServedModel
    from .library import LibraryHost, model_id

    served: ServedModel | None = None
    if args.library:
        host = LibraryHost(library(args.data_dir), backend=args.backend, n_ctx=args.n_ctx, parallel=args.parallel,
                           max_resident=args.max_resident, active=lambda model: served.active_on(model),
                           thermal=lambda: thermal_monitor(args.thermal, args.parallel))
    else:
        model = load(args.model, backend=args.backend, n_ctx=args.n_ctx, kv_type=args.kv_type)
        for notice in model.notices:
            print(f"note: {notice}", file=sys.stderr)
        host = SchedulerThread(model, args.name or model_id(args.model), args.parallel,
                               thermal_monitor(args.thermal, args.parallel))
    served = ServedModel(host, max_queue=args.max_queue, timeout_s=args.timeout, prefix_caches=args.prefix_caches)
    return served
