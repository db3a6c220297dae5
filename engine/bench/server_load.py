"""Server load test: N concurrent streaming clients against an OpenAI-compatible ``/v1/chat/completions``.

``python -m engine.bench.server_load --url http://127.0.0.1:8080 --model-name NAME`` (any server: Hearth's or
llama.cpp's ``llama-server``) or ``--gguf FILE`` to start Hearth's own server in this process; with ``--gguf``,
``--peer llama-server PATH`` (or ``$HEARTH_LLAMA_SERVER``) then starts llama.cpp's ``llama-server`` on the same
model (``-np N -t THREADS``, continuous batching is its default) and runs the same clients, prompts and token
counts against it, reporting both and the ratio of aggregate rates. Every client sends a different greedy prompt;
the check pass runs each prompt alone first, so a reply that differs under load (lost, cut short, or mixed with
another client's) is reported. Reports p50/p99 time to first token and aggregate generated tokens per second over
the loaded phase. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx

TOPICS = ("the sea", "mountains", "a city at night", "bread", "rain", "a library", "trains", "winter", "music",
          "a garden", "the moon", "coffee", "bicycles", "a forest", "the desert", "a lighthouse")


@dataclasses.dataclass(frozen=True)
class ClientResult:
    prompt: str
    text: str
    tokens: int
    ttft_s: float
    total_s: float
    complete: bool  # the stream ended with a finish reason and [DONE]


def prompts(n: int) -> list[str]:
    return [f"Write two sentences about {TOPICS[i % len(TOPICS)]} (request {i})." for i in range(n)]


async def stream_one(http: httpx.AsyncClient, model: str, prompt: str, max_tokens: int) -> ClientResult:
    """One streaming chat request, timed; the token count is the server's own (``usage``)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    start, first, text, tokens, finished, done = time.perf_counter(), None, [], 0, False, False
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk.get("timings", {}).get("predicted_n") and not tokens:  # llama-server's own count
                tokens = chunk["timings"]["predicted_n"]
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    first = first if first is not None else time.perf_counter()
                    text.append(piece)
                finished = finished or choice.get("finish_reason") is not None
    end = time.perf_counter()
    return ClientResult(prompt, "".join(text), tokens, (first or end) - start, end - start, finished and done)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_load(url: str, model: str, clients: int, max_tokens: int, check: bool) -> dict:
    """Run the check pass (each prompt alone) if asked, then all clients at once; return the report."""
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0)) as http:
        texts = prompts(clients)
        alone = [await stream_one(http, model, p, max_tokens) for p in texts] if check else []
        start = time.perf_counter()
        loaded = await asyncio.gather(*(stream_one(http, model, p, max_tokens) for p in texts))
        wall = time.perf_counter() - start
    ttfts = [r.ttft_s for r in loaded]
    report = {"clients": clients, "max_tokens": max_tokens, "wall_s": round(wall, 3),
              "generated_tokens": sum(r.tokens for r in loaded),
              "aggregate_tokens_per_second": round(sum(r.tokens for r in loaded) / wall, 2),
              "ttft_p50_s": round(statistics.median(ttfts), 4), "ttft_p99_s": round(percentile(ttfts, 0.99), 4),
              "incomplete": sum(not r.complete for r in loaded)}
    if check:
        report["mismatched"] = [r.prompt for r, a in zip(loaded, alone) if r.text != a.text or r.tokens != a.tokens]
    return report


def _serve_in_process(gguf: str, backend: str, clients: int):
    """Start Hearth's server on a free loopback port in a thread; return (url, name, server)."""
    import threading

    import uvicorn

    from ..model import load
    from ..serve.app import create_app
    from ..serve.host import ServedModel

    port = _free_port()
    served = ServedModel(load(gguf, backend=backend), "bench", parallel=clients, max_queue=4 * clients)
    server = uvicorn.Server(uvicorn.Config(create_app(served), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", "bench", server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(binary: str, gguf: str, clients: int, threads: int, ctx_per_client: int) -> Iterator[str]:
    """llama.cpp's ``llama-server`` on ``gguf`` with ``clients`` parallel slots, on a free loopback port, until the
    block ends; yields its base URL. Raises RuntimeError (with the tail of its log) when it does not come up."""
    import httpx

    port = _free_port()
    cmd = [binary, "-m", gguf, "-np", str(clients), "-t", str(threads), "-c", str(clients * ctx_per_client),
           "--host", "127.0.0.1", "--port", str(port)]
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 300
            while True:
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"llama-server did not start ({' '.join(cmd)}): {log.read()[-2000:]}")
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench.server_load", description=__doc__.splitlines()[0])
    p.add_argument("--url", help="the server's base URL (without /v1)")
    p.add_argument("--model-name", default="", help="the model id to send (with --url)")
    p.add_argument("--gguf", help="start Hearth's server on this model in-process instead of --url")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--no-check", action="store_true", help="skip running each prompt alone first")
    p.add_argument("--peer", nargs="+", metavar="llama-server [PATH]",
                   help="with --gguf: also run llama.cpp's llama-server at PATH (default $HEARTH_LLAMA_SERVER) with "
                        "the same clients, prompts and token counts, and report the ratio")
    p.add_argument("--threads", type=int, default=2, help="llama-server's -t (default 2)")
    p.add_argument("--ctx-per-client", type=int, default=512,
                   help="llama-server's context per slot; -c is this times --clients (default 512)")
    return p


def _peer_binary(p: argparse.ArgumentParser, peer: list[str] | None) -> str | None:
    """The llama-server binary ``--peer llama-server [PATH]`` names (PATH or $HEARTH_LLAMA_SERVER)."""
    if peer is None:
        return None
    if peer[0] != "llama-server" or len(peer) > 2:
        p.error("--peer takes llama-server and, optionally, its path")
    binary = peer[1] if len(peer) == 2 else os.environ.get("HEARTH_LLAMA_SERVER")
    if not binary:
        p.error("--peer llama-server needs its path (or $HEARTH_LLAMA_SERVER)")
    return binary


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if (args.url is None) == (args.gguf is None):
        p.error("give exactly one of --url and --gguf")
    peer_binary = _peer_binary(p, args.peer)
    if peer_binary and not args.gguf:
        p.error("--peer needs --gguf: both servers run the same model file")
    server = None
    url, name = args.url, args.model_name
    if args.gguf:
        url, name, server = _serve_in_process(args.gguf, args.backend, args.clients)
    report = asyncio.run(run_load(url, name, args.clients, args.max_tokens, not args.no_check))
    if server is not None:
        server.should_exit = True
    ok = report["incomplete"] == 0 and not report.get("mismatched")
    if peer_binary:
        with llama_server(peer_binary, args.gguf, args.clients, args.threads, args.ctx_per_client) as peer_url:
            peer = asyncio.run(run_load(peer_url, "peer", args.clients, args.max_tokens, False))
        report = {"hearth": report, "llama_server": peer, "ratio": round(
            report["aggregate_tokens_per_second"] / peer["aggregate_tokens_per_second"], 3)
            if peer["aggregate_tokens_per_second"] else None}
        ok = ok and peer["incomplete"] == 0
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
