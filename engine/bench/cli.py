"""``python -m engine bench``: the bench command line, dispatching to the runners of this package.

``bench MODEL [options]`` times one model (speed beside peers, host overhead per token with greedy or chat
sampling, batched decode, speculative decoding, session restore, or the MLX backend beside mlx-lm); ``bench make-models`` writes the real-size random-weight models;
``bench kernels`` times the C kernels matrix by matrix; ``bench bandwidth`` measures this machine's read bandwidth;
``bench expert-pages`` times a mixture of experts' products on the memory map against anonymous copies.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..backends import BACKENDS, KV_TYPES
from ..gguf_file import ModelFormatError

EPILOG = """other forms:
  python -m engine bench make-models [--out DIR] [--models ...] [--types ...] --vocab-from FILE ...
  python -m engine bench kernels --model MODEL.gguf [--reps N] [--llama]
  python -m engine bench bandwidth [--threads N] [--json]
  python -m engine bench expert-pages MODEL.gguf [--layers N] [--rounds N] [--threads N] [--json]"""


def main(argv: list[str]) -> int:
    """Run ``python -m engine bench ARGV``; the exit status (2 with a message on stderr for bad input)."""
    tools = {"make-models": _make_models, "kernels": _kernels, "bandwidth": _bandwidth, "expert-pages": _expert_pages}
    try:
        if argv and argv[0] in tools:
            return tools[argv[0]](argv[1:])
        return _bench_model(_model_parser().parse_args(argv))
    except (ModelFormatError, ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _model_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine bench", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Prefill/decode tokens per second, load time and memory, optionally "
                                            "beside peers (medians of interleaved runs, min/max in the JSON).")
    p.add_argument("model", type=Path)
    p.add_argument("--backend", choices=BACKENDS, default="cpu")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: physical cores); the peers get "
                                                             "the same number")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs; medians are reported")
    p.add_argument("--compare", action="append", default=[], metavar="PEER",
                   choices=["llama.cpp", "llama-bench", "hearth", "mlx-lm"],
                   help="repeatable: llama.cpp (llama-cpp-python, flash attention off and on), llama-bench "
                        "(llama.cpp's own binary), hearth (our engine twice: the harness's self-check), mlx-lm "
                        "(with --backend mlx)")
    p.add_argument("--llama-bench", type=Path, default=None, metavar="PATH",
                   help="the llama-bench binary (default: $HEARTH_LLAMA_BENCH, else the test helpers' build cache)")
    p.add_argument("--concurrency", type=int, default=None, help="decode N sequences batched; report aggregate and single tok/s")
    p.add_argument("--thermal-script", type=Path, default=None, help="replay a JSON trace of [t_seconds, state] through the thermal policy")
    p.add_argument("--session-restore", action="store_true",
                   help="time restoring a snapshot of --prompt-tokens tokens against processing them again")
    p.add_argument("--draft", type=Path, default=None, metavar="DRAFT_MODEL",
                   help="speculative decoding with this draft model beside plain decoding (greedy, interleaved)")
    p.add_argument("--lookup", action="store_true", help="speculative decoding by prompt lookup beside plain decoding")
    p.add_argument("--prompt-file", type=Path, default=None, metavar="FILE",
                   help="with --draft/--lookup: the prompt, as a user message in the chat template")
    p.add_argument("--load-memory", choices=["backend", "model", "peer"], default=None,
                   help="with --backend mlx: only the resident memory of a fresh process loading the file")
    p.add_argument("--no-memory", action="store_true",
                   help="with --backend mlx: skip the fresh-process memory figures (a file without a tokenizer)")
    p.add_argument("--sampling", choices=["greedy", "chat"], default=None,
                   help="host overhead per token instead of the peers: Model.generate's decode with this sampling "
                        "(chat: the engine's default penalties, top-k, top-p, min-p, temperature) beside the bare "
                        "backend forward on the same token ids, overhead in %% over interleaved pairs")
    for name, kind in SAMPLING_OVERRIDES.items():
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, default=None,
                       help=f"with --sampling: this {name} instead of the mode's (e.g. --sampling chat --top-k 0)")
    p.add_argument("--depth", type=int, action="append", default=[], metavar="N",
                   help="repeatable: time a --prompt-tokens chunk and --gen-tokens decode steps after N positions of "
                        "context (untimed fill, as llama-bench -d); peers: llama.cpp, llama-bench")
    p.add_argument("--kv-type", choices=KV_TYPES, default=None,
                   help="our KV cache type (cpu backend; default f16); the llama.cpp peers get the same -ctk/-ctv")
    p.add_argument("--json", action="store_true")
    return p


SAMPLING_OVERRIDES = {"top_k": int, "top_p": float, "min_p": float, "temperature": float}


def _bench_model(args) -> int:
    overrides = {name: getattr(args, name) for name in SAMPLING_OVERRIDES if getattr(args, name) is not None}
    if overrides and not args.sampling:
        raise ValueError(f"--{next(iter(overrides)).replace('_', '-')} needs --sampling greedy|chat")
    if args.load_memory:
        from .mlx_speed import load_memory

        report = load_memory(args.model, args.load_memory)
    elif args.depth:
        from .depth import run_depth_bench

        report = run_depth_bench(args.model, args.backend, args.threads, args.depth, args.prompt_tokens,
                                 args.gen_tokens, args.compare, args.repeats, args.kv_type, args.llama_bench)
    elif args.session_restore:
        from .speed import run_session_bench

        report = run_session_bench(args.model, args.backend, args.prompt_tokens, args.repeats)
    elif args.sampling:
        from .overhead import run_overhead_bench

        report = run_overhead_bench(args.model, args.backend, args.threads, args.prompt_tokens, args.gen_tokens,
                                    args.sampling, args.repeats, overrides)
    elif args.draft or args.lookup:
        from .speculative import run_speculative_bench

        report = run_speculative_bench(args.model, args.backend, args.threads, args.prompt_file, args.prompt_tokens,
                                       args.gen_tokens, args.draft, args.lookup, args.repeats)
    elif "mlx-lm" in args.compare or args.backend == "mlx":
        from .mlx_speed import run_mlx_bench

        report = run_mlx_bench(args.model, prompt_tokens=args.prompt_tokens, gen_tokens=args.gen_tokens,
                               compare="mlx-lm" in args.compare, repeats=args.repeats, memory=not args.no_memory)
    elif args.concurrency or args.thermal_script:
        from .concurrency import run_concurrency_bench

        report = run_concurrency_bench(args.model, args.backend, args.threads, args.prompt_tokens, args.gen_tokens,
                                       args.concurrency or 1, args.repeats, args.thermal_script)
    else:
        from .speed import run_bench

        report = run_bench(args.model, args.backend, args.threads, args.prompt_tokens, args.gen_tokens,
                           args.compare, args.repeats, args.llama_bench, args.kv_type)
    _emit(args.json, report)
    return 0


def _emit(as_json: bool, report: dict) -> None:
    if as_json:
        print(json.dumps(report, ensure_ascii=False, indent=1))
    else:
        print("\n".join(f"{k}: {v}" for k, v in report.items()))


def _kernels(argv: list[str]) -> int:
    from .kernels import main as kernels_main

    return kernels_main(argv)


def _bandwidth(argv: list[str]) -> int:
    from .bandwidth import measure_read_bandwidth

    p = argparse.ArgumentParser(prog="python -m engine bench bandwidth",
                                description="This machine's read bandwidth: STREAM-like sums over a buffer "
                                            "larger than the last-level cache, by NumPy and by the C kernels' read "
                                            "loop in turn; the best pass of either.")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    _emit(args.json, measure_read_bandwidth(args.threads, args.passes))
    return 0


def _expert_pages(argv: list[str]) -> int:
    from .expert_pages import run

    p = argparse.ArgumentParser(prog="python -m engine bench expert-pages",
                                description="A mixture of experts' decode products on the model's memory map against "
                                            "anonymous copies in 2 MiB and 4 KiB pages, paired in one process, with "
                                            "the pages' state from /proc/self/smaps.")
    p.add_argument("model", type=Path)
    p.add_argument("--layers", type=int, default=8, help="layers whose experts are copied (default 8)")
    p.add_argument("--rounds", type=int, default=10, help="rounds; each times every residency once, shuffled")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    _emit(args.json, run(args.model, args.layers, args.rounds, args.threads))
    return 0


def _make_models(argv: list[str]) -> int:
    from .model_shapes import FILE_TYPES, MOE_MODELS, REAL_MODELS, SHAPES, default_types
    from .model_writer import cache_dir, check_loads, write_models

    p = argparse.ArgumentParser(prog="python -m engine bench make-models",
                                description="Write random-weight GGUFs with the real shapes and metadata of the "
                                            "bench models (benchmarks only: the weights mean nothing).")
    p.add_argument("--out", type=Path, default=None,
                   help="directory (default: $HEARTH_BENCH_MODELS, else the user cache's hearth-bench-models)")
    p.add_argument("--models", nargs="+", default=list(REAL_MODELS), choices=list(SHAPES), metavar="MODEL",
                   help=f"default: {' '.join(REAL_MODELS)}; also {' '.join(MOE_MODELS)} (12 and 18 GB, only when "
                        "named) and tiny-qwen3, tiny-llama, tiny-gpt-oss, tiny-qwen3moe (small shapes for tests)")
    p.add_argument("--types", nargs="+", default=None, choices=list(FILE_TYPES), metavar="TYPE",
                   help="file types (default: Q4_K_M Q8_0 Q4_0; MXFP4 for gpt-oss-20b, Q4_K_M for Qwen3-30B-A3B; for "
                        "Qwen3-1.7B also the IQ, MXFP4 and other "
                        f"K types); any of {' '.join(FILE_TYPES)}")
    p.add_argument("--vocab-from", type=Path, action="append", required=True, metavar="FILE",
                   help="repeatable: a GGUF whose tokenizer metadata is copied, one per vocabulary family "
                        "(a Qwen2.5/Qwen3 file or llama.cpp's ggml-vocab-qwen2.gguf; a Llama 3 file or "
                        "ggml-vocab-llama-bpe.gguf)")
    p.add_argument("--force", action="store_true", help="rewrite files that are already there")
    p.add_argument("--check", action="store_true",
                   help="load each file in llama.cpp (llama-cpp-python) and in ours and run a few tokens")
    args = p.parse_args(argv)
    results = write_models(args.out or cache_dir(), args.models, args.types, args.vocab_from, args.force,
                           default_types)
    if args.check:
        for result in results:
            if "skipped" not in result:
                result["loads"] = check_loads(Path(result["file"]))
    print(json.dumps(results, indent=1))
    return 0
