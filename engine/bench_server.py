"""Server load test: N concurrent streaming clients against an OpenAI-compatible ``/v1/chat/completions``.

``python -m engine.bench_server --url http://127.0.0.1:8080 --model-name NAME`` (any server: Hearth's or
llama.cpp's ``llama-server``) or ``--gguf FILE`` to start Hearth's own server in this process. Every client sends
a different greedy prompt; the check pass runs each prompt alone first, so a reply that differs under load (lost,
cut short, or mixed with another client's) is reported. Reports p50/p99 time to first token and aggregate
generated tokens per second over the loaded phase. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import time

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
    import socket
    import threading

    import uvicorn

    from .model import load
    from .serve.app import create_app
    from .serve.host import ServedModel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    served = ServedModel(load(gguf, backend=backend), "bench", parallel=clients, max_queue=4 * clients)
    server = uvicorn.Server(uvicorn.Config(create_app(served), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", "bench", server


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench_server", description=__doc__.splitlines()[0])
    p.add_argument("--url", help="the server's base URL (without /v1)")
    p.add_argument("--model-name", default="", help="the model id to send (with --url)")
    p.add_argument("--gguf", help="start Hearth's server on this model in-process instead of --url")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--no-check", action="store_true", help="skip running each prompt alone first")
    args = p.parse_args(argv)
    if (args.url is None) == (args.gguf is None):
        p.error("give exactly one of --url and --gguf")
    server = None
    url, name = args.url, args.model_name
    if args.gguf:
        url, name, server = _serve_in_process(args.gguf, args.backend, args.clients)
    report = asyncio.run(run_load(url, name, args.clients, args.max_tokens, not args.no_check))
    if server is not None:
        server.should_exit = True
    print(json.dumps(report, indent=2))
    return 0 if report["incomplete"] == 0 and not report.get("mismatched") else 1


if __name__ == "__main__":
    sys.exit(main())
