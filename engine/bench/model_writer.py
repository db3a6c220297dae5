"""Writes random-weight GGUF files with the real shapes and metadata of the bench models (``model_shapes``).

Blocks are written directly in each type's packed layout: random codes, then every block's scale fields set so
the dequantized weights have a fixed spread (std 0.02, as trained models of this size roughly have), so no
float32 tensor is ever built and an 8B file takes as long as the disk does. A pool of blocks is made once per
type and every tensor is cut from it at a random block offset. The tokenizer's metadata is copied from a real
file of the same vocabulary family (``--vocab-from``: a real model or one of llama.cpp's ``ggml-vocab-*.gguf``).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

import gguf
import numpy as np
import platformdirs

from ..ggml_types import GGML_QUANT_SIZES
from ..gguf_file import read_gguf
from ..packed_strings import PackedStrings
from ..ggml_types import GGMLQuantizationType as Q
from .model_shapes import SHAPES, ModelShape, tensor_type

WEIGHT_STD = 0.02
POOL_BLOCKS = 8192
# The byte offsets of each block's float16 scales (ggml-common.h); MXFP4's one scale is an E8M0 exponent at 0.
F16_SCALES = {
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.Q2_K: (80, 82), Q.Q3_K: (108,),
    Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.IQ2_XXS: (0,), Q.IQ2_XS: (0,), Q.IQ2_S: (0,),
    Q.IQ3_XXS: (0,), Q.IQ3_S: (0,), Q.IQ4_NL: (0,), Q.IQ4_XS: (0,),
}
ARRAY_TYPES = {np.dtype(np.int32): gguf.GGUFValueType.INT32, np.dtype(np.uint32): gguf.GGUFValueType.UINT32,
               np.dtype(np.float32): gguf.GGUFValueType.FLOAT32, np.dtype(np.int64): gguf.GGUFValueType.INT64,
               np.dtype(np.uint8): gguf.GGUFValueType.UINT8, np.dtype(np.int8): gguf.GGUFValueType.INT8}
FILE_TYPE_IDS = {"MXFP4": gguf.LlamaFileType.MOSTLY_MXFP4_MOE}


def cache_dir() -> Path:
    """Where the bench models are kept by default: the user cache's ``hearth-bench-models``."""
    return Path(os.environ.get("HEARTH_BENCH_MODELS") or platformdirs.user_cache_dir("hearth-bench-models"))


def block_pool(qtype: Q, rng: np.random.Generator, n_blocks: int = POOL_BLOCKS) -> np.ndarray:
    """``n_blocks`` random blocks of ``qtype`` as uint8 (n_blocks, block_bytes), scaled to WEIGHT_STD."""
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    pool = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    _set_scales(pool, qtype, np.ones(n_blocks, np.float32))
    std = float(gguf.quants.dequantize(pool.reshape(1, -1), qtype).std())
    scale = WEIGHT_STD / std * rng.uniform(0.75, 1.25, n_blocks).astype(np.float32)
    _set_scales(pool, qtype, scale)
    return pool


def _set_scales(pool: np.ndarray, qtype: Q, scale: np.ndarray) -> None:
    if qtype == Q.MXFP4:
        pool[:, 0] = np.clip(127 + np.round(np.log2(scale)), 1, 254).astype(np.uint8)  # E8M0: 2**(e - 127)
        return
    halves = scale.astype(np.float16).view(np.uint8).reshape(-1, 2)
    for offset in F16_SCALES[qtype]:
        pool[:, offset:offset + 2] = halves


def tensor_plan(shape: ModelShape, file_type: str, n_vocab: int) -> list[tuple[str, tuple[int, ...], Q]]:
    """Every tensor of the file: (name, shape as (rows, cols) in elements, GGML type), in llama.cpp's names."""
    e, kv = shape.n_embd, shape.n_kv_heads * shape.head_dim
    q_dim = shape.n_heads * shape.head_dim
    plan = [("token_embd.weight", (n_vocab, e),
             tensor_type(file_type, "output" if shape.tied_embeddings else "token_embd", 0, shape.n_layers))]
    if shape.llama3_rope:
        plan.append(("rope_freqs.weight", (shape.head_dim // 2,), Q.F32))
    for i in range(shape.n_layers):
        b = f"blk.{i}"
        plan.append((f"{b}.attn_norm.weight", (e,), Q.F32))
        for role, dims in (("attn_q", (q_dim, e)), ("attn_k", (kv, e)), ("attn_v", (kv, e)),
                           ("attn_output", (e, q_dim))):
            plan.append((f"{b}.{role}.weight", dims, tensor_type(file_type, role, i, shape.n_layers)))
        if shape.arch == "qwen2":
            plan += [(f"{b}.attn_q.bias", (q_dim,), Q.F32), (f"{b}.attn_k.bias", (kv,), Q.F32),
                     (f"{b}.attn_v.bias", (kv,), Q.F32)]
        if shape.arch == "qwen3":
            plan += [(f"{b}.attn_q_norm.weight", (shape.head_dim,), Q.F32),
                     (f"{b}.attn_k_norm.weight", (shape.head_dim,), Q.F32)]
        plan.append((f"{b}.ffn_norm.weight", (e,), Q.F32))
        for role, dims in (("ffn_gate", (shape.n_ff, e)), ("ffn_up", (shape.n_ff, e)), ("ffn_down", (e, shape.n_ff))):
            plan.append((f"{b}.{role}.weight", dims, tensor_type(file_type, role, i, shape.n_layers)))
    plan.append(("output_norm.weight", (e,), Q.F32))
    if not shape.tied_embeddings:
        plan.append(("output.weight", (n_vocab, e), tensor_type(file_type, "output", 0, shape.n_layers)))
    return plan


def tensor_nbytes(dims: tuple[int, ...], qtype: Q) -> int:
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    if dims[-1] % block_elems:
        raise ValueError(f"rows of {dims[-1]} elements are not whole {qtype.name} blocks of {block_elems}")
    return math.prod(dims) // block_elems * block_bytes


def llama3_rope_factors(shape: ModelShape) -> np.ndarray:
    """Llama 3.1's per-frequency RoPE divisors (``rope_freqs.weight``), from its published scaling rule."""
    factor, low, high, old_ctx = shape.llama3_rope
    freqs = shape.rope_base ** -(np.arange(0, shape.head_dim, 2, dtype=np.float64) / shape.head_dim)
    wavelen = 2 * math.pi / freqs
    smooth = np.clip((old_ctx / wavelen - low) / (high - low), 0.0, 1.0)
    factors = 1.0 / ((1 - smooth) / factor + smooth)
    return factors.astype(np.float32)


class VocabSource:
    """The ``tokenizer.*`` metadata of a GGUF file, to copy into a written model (read with our own reader:
    gguf's reader builds one array per string and takes half a minute on a 150k-token vocabulary)."""

    def __init__(self, path: Path):
        with read_gguf(path) as source:
            self.values = {k: _copyable(v) for k, v in source.metadata.items() if k.startswith("tokenizer.")}
        self.path = Path(path)
        if "tokenizer.ggml.tokens" not in self.values:
            raise ValueError(f"{path} holds no tokenizer (no tokenizer.ggml.tokens)")
        self.pre = self.values.get("tokenizer.ggml.pre", "default")
        self.n_vocab = len(self.values["tokenizer.ggml.tokens"])

    def write_to(self, writer: gguf.GGUFWriter) -> None:
        for name, value in self.values.items():
            if isinstance(value, np.ndarray):
                writer.add_key_value(name, value.tolist(), gguf.GGUFValueType.ARRAY, sub_type=ARRAY_TYPES[value.dtype])
            elif isinstance(value, list):
                writer.add_array(name, value)
            elif isinstance(value, bool):
                writer.add_bool(name, value)
            elif isinstance(value, int):
                writer.add_uint32(name, value) if value >= 0 else writer.add_int32(name, value)
            elif isinstance(value, float):
                writer.add_float32(name, value)
            else:
                writer.add_string(name, value)


def _copyable(value):
    return list(value) if isinstance(value, PackedStrings) else value


def write_model(path: Path, name: str, file_type: str, vocab: VocabSource, seed: int = 0) -> dict:
    """Write one bench model to ``path`` (through ``path.partial``, renamed when complete).

    Returns:
        ``file``, ``model``, ``type``, ``bytes``, ``seconds``, ``n_vocab`` and ``tensor_types`` (count per type).
    """
    shape = SHAPES[name]
    if vocab.pre != shape.vocab_pre:
        raise ValueError(f"{name} needs a {shape.vocab_pre!r} vocabulary; {vocab.path} has {vocab.pre!r}")
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    plan = tensor_plan(shape, file_type, vocab.n_vocab)
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(partial, shape.arch)
    _write_metadata(writer, shape, name, file_type, vocab)
    for tname, dims, qtype in plan:
        writer.add_tensor_info(tname, dims, np.dtype(np.float32), tensor_nbytes(dims, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    pools: dict[Q, np.ndarray] = {}
    for tname, dims, qtype in plan:
        writer.write_tensor_data(_tensor_data(tname, dims, qtype, shape, pools, rng))
    writer.close()
    partial.rename(path)
    counts: dict[str, int] = {}
    for _, _, qtype in plan:
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
    return {"file": str(path), "model": name, "type": file_type, "bytes": path.stat().st_size,
            "seconds": round(time.perf_counter() - start, 1), "n_vocab": vocab.n_vocab, "tensor_types": counts}


def _tensor_data(tname: str, dims: tuple[int, ...], qtype: Q, shape: ModelShape, pools: dict,
                 rng: np.random.Generator) -> np.ndarray:
    if qtype == Q.F32:
        if tname == "rope_freqs.weight":
            return llama3_rope_factors(shape)
        if tname.endswith(".bias"):
            return rng.normal(0, WEIGHT_STD, dims).astype(np.float32)
        return np.ones(dims, np.float32)  # norms
    pool = pools.get(qtype)
    if pool is None:
        pool = pools[qtype] = block_pool(qtype, rng).reshape(-1)
    nbytes = tensor_nbytes(dims, qtype)
    start = int(rng.integers(0, POOL_BLOCKS)) * GGML_QUANT_SIZES[qtype][1]
    return np.resize(np.concatenate([pool[start:], pool[:start]]), nbytes)


def _write_metadata(writer: gguf.GGUFWriter, shape: ModelShape, name: str, file_type: str,
                    vocab: VocabSource) -> None:
    writer.add_name(f"{name} {file_type} (random weights, Hearth bench)")
    writer.add_file_type(int(FILE_TYPE_IDS.get(file_type) or gguf.LlamaFileType[f"MOSTLY_{file_type}"]))
    writer.add_block_count(shape.n_layers)
    writer.add_context_length(shape.n_ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_heads)
    writer.add_head_count_kv(shape.n_kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_vocab_size(vocab.n_vocab)
    vocab.write_to(writer)


def write_models(out: Path, models: list[str], types: list[str] | None, vocab_files: list[Path],
                 force: bool = False, default_types=None) -> list[dict]:
    """Write every (model, type) asked for into ``out``; a file already there is kept unless ``force``.

    A file the disk has no room for (its size plus 2 GB kept free) is skipped and reported as such.
    """
    unknown = [m for m in models if m not in SHAPES]
    if unknown:
        raise ValueError(f"unknown model {unknown[0]!r}; known: {', '.join(SHAPES)}")
    vocabs = {v.pre: v for v in map(VocabSource, vocab_files)}
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in models:
        vocab = vocabs.get(SHAPES[name].vocab_pre)
        if vocab is None:
            raise ValueError(f"{name} needs a --vocab-from file with a {SHAPES[name].vocab_pre!r} vocabulary "
                             f"(given: {', '.join(sorted(vocabs)) or 'none'})")
        for file_type in types or default_types(name):
            results.append(_write_one(out, name, file_type, vocab, force))
    return results


def _write_one(out: Path, name: str, file_type: str, vocab: VocabSource, force: bool) -> dict:
    path = out / f"{name}-{file_type}.gguf"
    if path.exists() and not force:
        return {"file": str(path), "model": name, "type": file_type, "bytes": path.stat().st_size, "kept": True}
    size = sum(tensor_nbytes(d, q) for _, d, q in tensor_plan(SHAPES[name], file_type, vocab.n_vocab))
    free = shutil.disk_usage(out).free
    if size + 2 * 2**30 > free:
        return {"file": str(path), "model": name, "type": file_type, "bytes": size,
                "skipped": f"needs {size / 1e9:.1f} GB, {free / 1e9:.1f} GB free"}
    return write_model(path, name, file_type, vocab)


def check_loads(path: Path, ids: tuple[int, ...] = (1, 2, 3, 4)) -> dict:
    """Load ``path`` in llama.cpp (llama-cpp-python) and in our CPU backend and run ``ids`` through each.

    Returns:
        ``llama.cpp`` and ``hearth``: True, or the error's message; ``same_argmax``: whether both engines'
        last-position argmax agree (None when either failed).
    """
    out: dict = {}
    argmax = {}
    try:
        import llama_cpp

        llm = llama_cpp.Llama(model_path=str(path), n_ctx=32, verbose=False)
        llm.eval(list(ids))
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        argmax["llama.cpp"] = int(np.argmax(logits))
        llm.close()
        out["llama.cpp"] = True
    except Exception as e:  # a report of what failed, for every file: not a crash half-way
        out["llama.cpp"] = f"{type(e).__name__}: {e}"
    try:
        from ..model import load

        model = load(path, "cpu", 32)
        argmax["hearth"] = int(np.argmax(model.backend.forward(list(ids), model.backend.new_cache(32))))
        out["hearth"] = True
    except Exception as e:
        out["hearth"] = f"{type(e).__name__}: {e}"
    out["same_argmax"] = argmax["llama.cpp"] == argmax["hearth"] if len(argmax) == 2 else None
    return out
