"""Time the CPU kernels on Qwen2.5-Coder-0.5B's real matrices and print the numbers as JSON.

Run ``python -m engine bench kernels --model PATH [--reps N]`` (Qwen2.5-Coder-0.5B's file is what the default
tensor names fit). For each matrix: the time of
a matrix-vector product (decode) at 1 thread and at the default thread count, the weight bytes read per
second, the same product through NumPy (dequantize then multiply, and multiply by weights dequantized once
beforehand), and a 64-token product (prefill) in GFLOP/s. Both the median and the best of the repetitions
are printed: on a shared machine the median measures the neighbours too, the best what the kernel can do.

``--llama`` adds a comparison with llama.cpp (llama-cpp-python, the ``bench`` extra) in CPU time of one
thread, which neighbours on a shared machine do not inflate: llama.cpp's whole decode step and 64-token
prompt against this module's matrix products for the same token counts (logits of the last token only,
as llama.cpp computes them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
from gguf.quants import dequantize

from ..backends.cpu import kernels
from ..gguf_file import read_gguf

TENSORS = ("blk.0.ffn_down.weight", "blk.0.ffn_up.weight", "blk.2.ffn_down.weight", "output.weight", "token_embd.weight")


def timings(fn, reps: int) -> tuple[float, float]:
    """(median, best) seconds of fn over reps calls."""
    fn()  # warm the caches and the pool
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def bench_tensor(g, name: str, reps: int, threads: list[int]) -> dict:
    info = g.tensor(name)
    w = g.raw(name)
    rows, cols = w.shape[0], kernels.row_elements(info.qtype, w.shape[1])
    rng = np.random.default_rng(0)
    x1 = rng.standard_normal((1, cols)).astype(np.float32)
    x64 = rng.standard_normal((64, cols)).astype(np.float32)
    out1, out64 = np.empty((1, rows), np.float32), np.empty((64, rows), np.float32)
    result = {"type": info.qtype.name, "shape": [rows, cols], "weight_mb": round(w.nbytes / 1e6, 2)}
    for n_threads in threads:
        kernels.set_threads(n_threads)
        median, best = timings(lambda: kernels.matmul(w, info.qtype, x1, out1), reps)
        result[f"matvec_us_{n_threads}t"] = {"median": round(median * 1e6, 1), "best": round(best * 1e6, 1)}
        result[f"matvec_gbps_{n_threads}t"] = {"median": round(w.nbytes / median / 1e9, 2), "best": round(w.nbytes / best / 1e9, 2)}
        median, best = timings(lambda: kernels.matmul(w, info.qtype, x64, out64), max(3, reps // 10))
        flops = 2 * 64 * rows * cols
        result[f"prefill64_gflops_{n_threads}t"] = {"median": round(flops / median / 1e9, 1), "best": round(flops / best / 1e9, 1)}
    numpy_reps = max(3, reps // 20)
    result["numpy_dequant_matvec_us"] = round(timings(lambda: x1 @ dequantize(w, info.qtype).T, numpy_reps)[0] * 1e6, 1)
    wf = dequantize(w, info.qtype).astype(np.float32).reshape(rows, cols)
    result["numpy_f32_matvec_us"] = round(timings(lambda: x1 @ wf.T, numpy_reps)[0] * 1e6, 1)
    return result


def _products(g, n: int) -> list[tuple]:
    """Every 2-D weight but the embedding table for n tokens, and the output matrix for the last token."""
    head = "output.weight" if "output.weight" in g.tensors else "token_embd.weight"
    cases = []
    for name, info in g.tensors.items():
        if len(info.shape) == 2 and name not in ("token_embd.weight", "output.weight"):
            cases.append((g.raw(name), info.qtype, n))
    cases.append((g.raw(head), g.tensor(head).qtype, 1))
    return [(w, qtype, np.ones((m, kernels.row_elements(qtype, w.shape[1])), np.float32),
             np.empty((m, w.shape[0]), np.float32)) for w, qtype, m in cases]


def bench_decode_pass(g, reps: int, threads: list[int]) -> dict:
    """One token's matrix-vector products over every 2-D weight but the embedding table, back to back.

    This bounds decode speed from the kernels alone (no attention, norms or Python between them)."""
    cases = _products(g, 1)
    total_bytes = sum(w.nbytes for w, *_ in cases)

    def one_pass() -> None:
        for w, qtype, x, out in cases:
            kernels.matmul(w, qtype, x, out)

    result = {"matrices": len(cases), "weight_mb": round(total_bytes / 1e6, 1)}
    for n_threads in threads:
        kernels.set_threads(n_threads)
        median, best = timings(one_pass, reps)
        result[f"ms_{n_threads}t"] = {"median": round(median * 1e3, 2), "best": round(best * 1e3, 2)}
        result[f"gbps_{n_threads}t"] = {"median": round(total_bytes / median / 1e9, 1), "best": round(total_bytes / best / 1e9, 1)}
        result[f"tokens_per_second_bound_{n_threads}t"] = {"median": round(1 / median, 1), "best": round(1 / best, 1)}
    return result


def bench_vs_llama(path: str, reps: int) -> dict:
    """Median CPU milliseconds of one thread: llama.cpp's decode step and 64-token prompt vs our products."""
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_threads=1, n_threads_batch=1, n_ctx=512, n_batch=512, verbose=False)
    g = read_gguf(path)
    kernels.set_threads(1)
    products = {n: _products(g, n) for n in (1, 64)}
    prompt = list(range(1000, 1064))

    def ours(n: int) -> float:
        start = time.thread_time()
        for w, qtype, x, out in products[n]:
            kernels.matmul(w, qtype, x, out)
        return time.thread_time() - start

    def llama(tokens: list[int], reset: bool) -> float:
        if reset:
            llm.reset()
        start = time.thread_time()
        llm.eval(tokens)
        return time.thread_time() - start

    times: dict[str, list[float]] = {"llama_decode": [], "hearth_decode_products": [],
                                     "llama_prefill64": [], "hearth_prefill64_products": []}
    for _ in range(reps):
        times["llama_prefill64"].append(llama(prompt, True))
        times["hearth_prefill64_products"].append(ours(64))
        times["llama_decode"].append(llama([1234], False))
        times["hearth_decode_products"].append(ours(1))
    return {f"{k}_cpu_ms": round(statistics.median(v) * 1e3, 1) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine bench kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--model", required=True, help="a GGUF file (e.g. the Qwen2.5-Coder-0.5B test model)")
    parser.add_argument("--tensors", nargs="+", default=list(TENSORS), help="the matrices to time one by one")
    parser.add_argument("--llama", action="store_true", help="compare with llama.cpp (needs llama-cpp-python)")
    args = parser.parse_args(argv)
    if not kernels.AVAILABLE:
        raise RuntimeError("the C kernels are not built (python setup.py build_ext --inplace)")
    g = read_gguf(args.model)
    threads = sorted({1, kernels.default_threads()})
    report = {"isa": kernels.active_isa(), "available": kernels.AVAILABLE, "threads": threads, "reps": args.reps,
              "tensors": {name: bench_tensor(g, name, args.reps, threads) for name in args.tensors},
              "decode_pass": bench_decode_pass(g, max(5, args.reps // 5), threads)}
    if args.llama:
        report["vs_llama_cpp_1_thread"] = bench_vs_llama(str(args.model), max(5, args.reps // 5))
    kernels.set_threads(kernels.default_threads())
    json.dump(report, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0

