"""Time the CPU kernels on Qwen2.5-Coder-0.5B's real matrices and print the numbers as JSON.

Run ``python -m engine.backends.cpu.bench_kernels [--reps N] [--model PATH]``. For each matrix: the time of
a matrix-vector product (decode) at 1 thread and at the default thread count, the weight bytes read per
second, the same product through NumPy (dequantize then multiply, and multiply by weights dequantized once
beforehand), and a 64-token product (prefill) in GFLOP/s. Both the median and the best of the repetitions
are printed: on a shared machine the median measures the neighbours too, the best what the kernel can do.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
from gguf.quants import dequantize

from engine.backends.cpu import kernels
from engine.gguf_file import read_gguf

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


def bench_decode_pass(g, reps: int, threads: list[int]) -> dict:
    """One token's matrix-vector products over every 2-D weight but the embedding table, back to back.

    This bounds decode speed from the kernels alone (no attention, norms or Python between them)."""
    weights = [(g.raw(name), info.qtype) for name, info in g.tensors.items()
               if len(info.shape) == 2 and name != "token_embd.weight"]
    if "output.weight" not in g.tensors:  # tied embeddings: the output product reads the embedding table
        info = g.tensor("token_embd.weight")
        weights.append((g.raw("token_embd.weight"), info.qtype))
    cases = []
    for w, qtype in weights:
        cols = kernels.row_elements(qtype, w.shape[1])
        cases.append((w, qtype, np.ones((1, cols), np.float32), np.empty((1, w.shape[0]), np.float32)))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--model", help="a GGUF file (default: the Qwen2.5-Coder-0.5B test model)")
    args = parser.parse_args(argv)
    if args.model is None:
        from tests.model_store import model_path

        args.model = model_path("qwen25coder")
    g = read_gguf(args.model)
    threads = sorted({1, kernels.default_threads()})
    report = {"isa": kernels.active_isa(), "available": kernels.AVAILABLE, "threads": threads, "reps": args.reps,
              "tensors": {name: bench_tensor(g, name, args.reps, threads) for name in TENSORS if name in g.tensors},
              "decode_pass": bench_decode_pass(g, max(5, args.reps // 5), threads)}
    kernels.set_threads(kernels.default_threads())
    json.dump(report, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
