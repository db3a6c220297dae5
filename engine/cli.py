"""The ``python -m engine`` command line: inspect, tokenize, render, generate and bench a GGUF model."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from .backends import BACKENDS, KV_TYPES
from .gguf_file import ModelFormatError, read_gguf
from .packed_strings import PackedStrings

_ARRAY_PREVIEW = 8


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # its own command line, with sub-forms (make-models, kernels, bandwidth)
        return _bench(argv[1:])
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except (ModelFormatError, ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="Hearth's inference engine on GGUF models.")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    p = sub.add_parser("inspect", help="whether Hearth runs the file and why not; metadata, tensor types, "
                                       "parameter count, estimated memory per backend, the MLX compute dtype and why")
    p.add_argument("model", type=Path)
    p.add_argument("--n-ctx", type=int, default=4096, help="context length for the memory estimate")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="the backend to judge the file for (default: the one this machine would use)")
    p.add_argument("--json", action="store_true", help="one JSON object; 'runs' and 'reasons' carry the verdict")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("tokenize", help="token ids of a text, with llama.cpp's semantics")
    p.add_argument("model", type=Path)
    p.add_argument("text")
    p.add_argument("--no-add-special", action="store_true", help="do not add BOS/EOS")
    p.add_argument("--parse-special", action="store_true", help="match control tokens written in the text")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tokenize)

    p = sub.add_parser("render", help="apply the model's chat template to a messages JSON file")
    p.add_argument("model", type=Path)
    p.add_argument("messages", type=Path, help='JSON list of {"role": ..., "content": ...}')
    p.add_argument("--no-generation-prompt", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("generate", help="generate text from a prompt (streamed), here or on a remote server")
    p.add_argument("model", help="a GGUF file, or with --remote the model's id on that server")
    p.add_argument("--prompt", help="raw prompt text (special tokens in it are parsed)")
    p.add_argument("--chat", help="a user message, wrapped in the model's chat template")
    p.add_argument("--system", help="system prompt for --chat")
    p.add_argument("--backend", choices=BACKENDS, default="auto")
    p.add_argument("--n-ctx", type=int, default=None)
    p.add_argument("--kv-type", choices=KV_TYPES, default=None, help="the cpu backend's KV cache type, as llama.cpp's -ctk/-ctv: f16 (default), f32, or q8_0 (8-bit blocks: 47 %% less KV memory, logits within about 1 of llama.cpp's; see the README)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--save-session", type=Path, metavar="FILE",
                   help="after generating, snapshot the sequence (tokens, KV cache, sampler state) to FILE")
    p.add_argument("--load-session", type=Path, metavar="FILE",
                   help="restore a snapshot and continue generating where it stopped (no --prompt needed)")
    p.add_argument("--json", action="store_true", help="print one JSON object with ids, text and timings")
    p.add_argument("--remote", metavar="URL", help="an OpenAI-compatible server (http://host:port[/v1]) that "
                   "serves MODEL; --prompt and --chat are then sent as a user message of a chat request")
    p.add_argument("--api-key-env", metavar="VAR", help="with --remote: the environment variable holding the key")
    p.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="with --remote: an extra request header (repeatable)")
    p.add_argument("--allow-self-signed", action="store_true", help="with --remote: accept any https certificate")
    p.add_argument("--stall-timeout", type=float, default=60.0, metavar="S",
                   help="with --remote: end the answer when nothing arrives for S seconds (default 60)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("bench", add_help=False,
                       help="prefill/decode speed, load time and memory beside peers; bench models and kernels "
                            "(python -m engine bench --help)")
    p.set_defaults(func=lambda args: _bench([]))
    return parser


def _emit(args, data, text: str) -> None:
    print(json.dumps(data, ensure_ascii=False, indent=1) if args.json else text)


def _metadata_summary(value):
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, PackedStrings)) and len(value) > _ARRAY_PREVIEW:
        return {"array_length": len(value), "first": value[:_ARRAY_PREVIEW]}
    return list(value) if isinstance(value, PackedStrings) else value


def cmd_inspect(args) -> int:
    from .compatibility import check
    from .memory_estimate import fit_verdict, system_memory

    with read_gguf(args.model) as gguf:
        verdict = check(gguf, args.backend, args.n_ctx)
        judged = verdict.memory.get(verdict.backend)
        available = system_memory().available_bytes
        data = {
            "file": str(args.model), "file_bytes": gguf.file_size, "gguf_version": gguf.version,
            "architecture": verdict.architecture, "backend": verdict.backend, "runs": verdict.runs,
            "reasons": list(verdict.reasons), "parameters": verdict.parameter_count, "tensors": len(gguf.tensors),
            "context_length": verdict.context_length, "tensor_types": verdict.tensor_types,
            "memory_estimate": _estimate_dict(judged, args.n_ctx) if judged else None,
            "available_bytes": available, "fit": fit_verdict(judged.total_bytes, available, judged.mapped_bytes)
            if judged else None,
            "memory_estimates": {name: _estimate_dict(e, args.n_ctx) for name, e in verdict.memory.items()},
            "mlx_compute": _mlx_compute(gguf),
            "metadata": {k: _metadata_summary(v) for k, v in gguf.metadata.items()},
        }
    _emit(args, data, "\n".join(_inspect_lines(data, args.n_ctx)))
    return 0


def _mlx_compute(gguf) -> dict | None:
    """The MLX backend's compute dtype and its reason, on a Mac GPU and on MLX's CPU device (None when the
    file's configuration or post-norm weights cannot be read)."""
    from .backends.mlx_compute import choose_for_file
    from .config import ModelConfig

    try:
        config = ModelConfig.from_gguf(gguf)
        return {device: dataclasses.asdict(choose_for_file(gguf, config, on_gpu=device == "gpu"))
                for device in ("gpu", "cpu")}
    except ModelFormatError:  # a missing post-norm tensor, too; the verdict above names what is wrong
        return None


def _estimate_dict(e, n_ctx: int) -> dict:
    return {"n_ctx": n_ctx, "weights_bytes": e.weights_bytes, "kv_cache_bytes": e.kv_cache_bytes,
            "overhead_bytes": e.overhead_bytes, "total_bytes": e.total_bytes,
            "active_weights_bytes": e.active_weights_bytes, "mapped_bytes": e.mapped_bytes}


def _inspect_lines(data: dict, n_ctx: int) -> list[str]:
    """The verdict first (one line per reason it will not load, or how it fits in memory), then the facts and
    the metadata."""
    from .memory_estimate import paging_note

    mib = 2 ** 20
    backend = data["backend"]
    if data["runs"]:
        need = data["memory_estimate"]
        lines = [f"runs here ({backend} backend)" + (f", needs {need['total_bytes'] / mib:,.0f} MiB at n_ctx {n_ctx}"
                                                   if need else "")]
        if need and data.get("fit") == "paged":
            lines.append(f"memory: {paging_note(need['mapped_bytes'], data['available_bytes'])}")
        elif need and data.get("fit") == "won't fit":
            lines.append(f"memory: won't fit in the {data['available_bytes'] / mib:,.0f} MiB free")
    else:
        lines = [f"won't load ({backend} backend): {reason}" for reason in data["reasons"]]
    lines += [f"{data['architecture'] or 'no architecture'}  {data['parameters'] / 1e6:.1f}M parameters  "
              f"{data['tensors']} tensors  {data['file_bytes'] / mib:.1f} MiB",
              "tensor types: " + ", ".join(f"{k} {v}" for k, v in data["tensor_types"].items())]
    for name, e in data["memory_estimates"].items():
        lines.append(f"estimated memory on {name} at n_ctx {n_ctx}: {e['total_bytes'] / mib:,.0f} MiB "
                     f"(weights {e['weights_bytes'] / mib:,.0f}, KV {e['kv_cache_bytes'] / mib:,.0f}, "
                     f"overhead {e['overhead_bytes'] / mib:,.0f})"
                     + (f"; all experts resident{' (memory-mapped)' if e['mapped_bytes'] else ''}, weights read "
                        f"per token {e['active_weights_bytes'] / mib:,.1f} MiB (the chosen experts only)"
                        if e["active_weights_bytes"] < e["weights_bytes"] else ""))
    if data["mlx_compute"]:
        gpu, cpu = data["mlx_compute"]["gpu"], data["mlx_compute"]["cpu"]
        lines.append(f"MLX compute dtype: {gpu['name']} on a Mac GPU ({gpu['reason']}); "
                     f"{cpu['name']} on MLX's CPU device ({cpu['reason']})")
    return lines + [""] + [f"{k} = {v}" for k, v in data["metadata"].items()]


def _load_tokenizer(path: Path):
    from .tokenizer import Tokenizer

    return Tokenizer.from_gguf(read_gguf(path))


def cmd_tokenize(args) -> int:
    tokenizer = _load_tokenizer(args.model)
    ids = tokenizer.encode(args.text, add_special=not args.no_add_special, parse_special=args.parse_special)
    pieces = [tokenizer.token_text(i) for i in ids]
    _emit(args, {"ids": ids, "pieces": pieces}, "\n".join(f"{i}\t{p!r}" for i, p in zip(ids, pieces)))
    return 0


def cmd_render(args) -> int:
    from .chat_template import ChatTemplate

    messages = json.loads(args.messages.read_text(encoding="utf-8"))
    with read_gguf(args.model) as gguf:
        tokenizer = _load_tokenizer(args.model)
        bos = tokenizer.token_text(tokenizer.bos_id) if tokenizer.bos_id is not None else ""
        eos = tokenizer.token_text(tokenizer.eos_id) if tokenizer.eos_id is not None else ""
        template, notice = ChatTemplate.for_model(gguf.metadata, bos_token=bos, eos_token=eos)
    text = template.render(messages, add_generation_prompt=not args.no_generation_prompt)
    if notice:
        print(f"note: {notice}", file=sys.stderr)
    _emit(args, {"text": text, "notice": notice}, text)
    return 0


def cmd_generate(args) -> int:
    if args.remote:
        from .remote.cli import cmd_generate_remote

        return cmd_generate_remote(args)
    from .model import load

    from .sampling import SamplingParams

    if sum(x is not None for x in (args.prompt, args.chat, args.load_session)) != 1:
        raise ValueError("give exactly one of --prompt, --chat and --load-session")
    model = load(args.model, backend=args.backend, n_ctx=args.n_ctx, kv_type=args.kv_type)
    for notice in model.notices:
        print(f"note: {notice}", file=sys.stderr)
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                            repeat_penalty=args.repeat_penalty, seed=args.seed)
    sampler_state = None
    if args.load_session is not None:
        session = model.load_session(args.load_session)
        ids_in, sampler_state = session.tokens, session.sampler_state
    elif args.chat is not None:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [{"role": "user", "content": args.chat}]
        ids_in = model.chat_ids(messages)
    else:
        ids_in = model.tokenize(args.prompt, add_special=True, parse_special=True)
    ids, text, last = [], [], None
    for event in model.generate_ids(ids_in, params, args.max_tokens, args.stop, sampler_state=sampler_state):
        ids.append(event.id)
        text.append(event.text)
        last = event
        if not args.json:
            print(event.text, end="", flush=True)
    stats = _stats(last)
    if args.save_session is not None:
        model.save_session(args.save_session)
    if args.json:
        print(json.dumps({"ids": ids, "text": "".join(text), **stats}, ensure_ascii=False))
    else:
        print(f"\n[{stats['generated_tokens']} tokens, {stats['prefill_tps']:.1f} prefill tok/s, "
              f"{stats['decode_tps']:.1f} decode tok/s, finish: {stats['finish_reason']}]", file=sys.stderr)
    return 0


def _stats(event) -> dict:
    if event is None:
        return {"generated_tokens": 0, "prompt_tokens": 0, "prefill_tps": 0.0, "decode_tps": 0.0, "finish_reason": None}
    return {"generated_tokens": event.generated_tokens, "prompt_tokens": event.prompt_tokens,
            "cached_tokens": event.cached_tokens, "time_to_first_token_s": round(event.prefill_s, 4),
            "prefill_tps": round(event.prefill_tps, 2), "decode_tps": round(event.decode_tps, 2),
            "finish_reason": event.finish_reason}


def _bench(argv: list[str]) -> int:
    from .bench.cli import main as bench_main  # the bench package: measurement apart from the product

    return bench_main(argv)
