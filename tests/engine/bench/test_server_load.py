"""The server load test through its command line: 16 (here 8) concurrent streaming clients lose and mix nothing,
and ``--peer llama-server`` runs llama.cpp's own server with the same clients and reports the ratio."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.llama_cpp_tools import tool_path
from tests.model_store import model_path

pytestmark = pytest.mark.slow


def run_bench(*args: str) -> tuple[int, dict, str]:
    done = subprocess.run([sys.executable, "-m", "engine.bench.server_load", "--gguf", str(model_path("smollm2")),
                           *args], capture_output=True, text=True, timeout=900)
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}, done.stderr


def check(report: dict, clients: int) -> None:
    assert report["clients"] == clients and report["incomplete"] == 0
    assert report["generated_tokens"] > clients and report["aggregate_tokens_per_second"] > 0
    assert 0 < report["ttft_p50_s"] <= report["ttft_p99_s"] <= report["wall_s"]


def test_eight_concurrent_clients_lose_and_mix_nothing():
    code, report, err = run_bench("--clients", "8", "--max-tokens", "24")
    assert code == 0, err
    check(report, 8)
    assert report["mismatched"] == []


def test_the_llama_server_peer_runs_the_same_clients_and_the_ratio_is_reported():
    code, report, err = run_bench("--clients", "4", "--max-tokens", "16", "--no-check", "--peer", "llama-server",
                                  str(tool_path("llama-server")))
    assert code == 0, err
    check(report["hearth"], 4)
    check(report["llama_server"], 4)
    assert report["ratio"] == pytest.approx(report["hearth"]["aggregate_tokens_per_second"]
                                            / report["llama_server"]["aggregate_tokens_per_second"], abs=1e-2)


def test_bad_peer_arguments_are_usage_errors():
    done = subprocess.run([sys.executable, "-m", "engine.bench.server_load", "--url", "http://127.0.0.1:9",
                           "--peer", "llama-server", "/bin/true"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--peer needs --gguf" in done.stderr
    done = subprocess.run([sys.executable, "-m", "engine.bench.server_load", "--gguf", "x.gguf", "--peer", "ollama"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "llama-server" in done.stderr
