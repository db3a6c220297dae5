"""``hearth serve``: load a model and serve the OpenAI- and Anthropic-compatible API with uvicorn, without Qt."""

from __future__ import annotations

import argparse
import ipaddress
import sys
from pathlib import Path

LOOPBACK_HOSTS = ("localhost",)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hearth serve",
                                description="Serve a GGUF model over OpenAI- and Anthropic-compatible HTTP APIs.")
    p.add_argument("--model", required=True, metavar="GGUF", help="the model file to serve")
    p.add_argument("--name", help="the model id clients send in 'model' (default: the file name without .gguf)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; any other needs --api-key)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--api-key", help="require this key (Authorization: Bearer KEY or x-api-key: KEY)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow browser requests from ORIGIN (CORS); repeat for more; off by default")
    p.add_argument("--backend", default="auto", choices=("auto", "numpy", "cpu", "mlx"), help="compute backend")
    p.add_argument("--n-ctx", type=int, default=None, help="context length in tokens")
    p.add_argument("--parallel", type=int, default=16, help="most sequences decoding together (default 16)")
    p.add_argument("--max-queue", type=int, default=64, help="most requests queued or running; more get 429")
    p.add_argument("--prefix-caches", type=int, default=4,
                   help="finished requests' KV caches kept for prompts that start the same (default 4)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a request may run (default 600)")
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


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        check_bind(args.host, args.api_key)
    except ValueError as e:
        print(f"hearth serve: {e}", file=sys.stderr)
        return 2
    import uvicorn

    from ..model import load
    from .app import create_app
    from .host import ServedModel

    model = load(args.model, backend=args.backend, n_ctx=args.n_ctx)
    for notice in model.notices:
        print(f"note: {notice}", file=sys.stderr)
    name = args.name or Path(args.model).name.removesuffix(".gguf")
    served = ServedModel(model, name, parallel=args.parallel, max_queue=args.max_queue, timeout_s=args.timeout,
                         prefix_caches=args.prefix_caches)
    app = create_app(served, api_key=args.api_key, allowed_origins=tuple(args.allow_origin))
    print(f"serving {name} at http://{args.host}:{args.port}/v1", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)
    return 0
