"""The server load test on a live SmolLM2 server: every client's stream completes and matches its reply alone."""

from __future__ import annotations

import asyncio

from engine.bench_server import percentile, run_load
from .conftest import MODEL_NAME


def test_percentile():
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(100)], 0.99) == 98.0


def test_eight_concurrent_clients_lose_and_mix_nothing(live_server):
    report = asyncio.run(run_load(live_server.base_url, MODEL_NAME, clients=8, max_tokens=24, check=True))
    assert report["incomplete"] == 0
    assert report["mismatched"] == []
    assert report["generated_tokens"] > 8
    assert report["ttft_p50_s"] <= report["ttft_p99_s"]
