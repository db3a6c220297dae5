"""The fused C decoder against the NumPy reference: every architecture switch, both KV element types, chunked
prompts, sliding windows, batched decode, cache state, errors, thread counts, the portable ISA and memory.

Tiny random-weight models with float32 weights isolate the decoder (no 8-bit activation rounding), so the C
decoder must match the NumPy reference to float precision. Quantized tiny models check the properties that
must hold bit for bit: a decode step equals the same row of a prefill pass (what speculative decoding rests
on), a batched step equals separate steps, and the thread count changes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from engine.backends import create_backend
from engine.backends.base import KVState
from engine.backends.cpu import kernels
from engine.backends.cpu.decoder import MAX_ROWS, CpuDecoder, CpuKVCache
from engine.backends.cpu_backend import CpuBackend
from engine.backends.numpy_backend import NumpyBackend
from engine.config import ModelConfig
from engine.gguf_file import read_gguf
from engine.kv_cache import GROWTH_STEP, NumpyKVCache
from tests.engine.synthetic.specs import SPECS
from tests.engine.synthetic.writer import write_synthetic
from tests.model_store import model_path

Q = GGMLQuantizationType
REPO = Path(__file__).resolve().parents[2]
N_VOCAB = 300
N_CTX = 2048
SLIDING_WINDOW = 8

# Per model: its architecture (the key, unless "arch" says), hyper-parameters and the switches it exercises.
ARCHS = {
    # rope_freqs factors and linear RoPE scaling, adjacent-pair RoPE, tied embeddings, GQA group 2
    "llama": dict(n_layers=2, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=16, n_ff=96, rope_dim=16,
                  extra={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}, rope_freqs=True),
    # YaRN: a per-dimension ramp folded into the frequencies and the mscale on cos and sin
    "llama-yarn": dict(arch="llama", n_layers=2, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=16, n_ff=96, rope_dim=16,
                       extra={"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
                              "llama.rope.scaling.original_context_length": 64}),
    # q/k/v biases, half-rotated heads (rope_dim < head_dim), one kv head for four query heads, untied output
    "qwen2": dict(n_layers=2, n_embd=64, n_heads=4, n_kv_heads=1, head_dim=16, n_ff=96, rope_dim=8, bias=True, tied=False),
    # per-head q/k norms without post norms
    "qwen3": dict(n_layers=2, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=16, n_ff=96, rope_dim=16, qk_norms=True),
    # q/k norms, post norms, gelu, embedding scale, head_dim != n_embd / n_heads, sliding layers 0-4 and 6 with
    # their own RoPE base, layer 5 global
    "gemma3": dict(n_layers=7, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=32, n_ff=96, rope_dim=32, qk_norms=True,
                   post_norms=True, extra={"gemma3.attention.sliding_window": SLIDING_WINDOW}),
    # attention and final softcaps, sliding layers alternating with global ones, post norms, gelu
    "gemma2": dict(n_layers=4, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=16, n_ff=96, rope_dim=16, post_norms=True,
                   extra={"gemma2.attention.sliding_window": SLIDING_WINDOW, "gemma2.attn_logit_softcapping": 5.0,
                          "gemma2.final_logit_softcapping": 15.0}),
    # fused q/k/v and gate/up tensors (row ranges), LongRoPE factors, partial rotary
    "phi3": dict(n_layers=2, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=16, n_ff=96, rope_dim=8, fused=True,
                 rope_factors=True, tied=False, extra={"phi3.rope.scaling.original_context_length": 64}),
    # YaRN and the queries' temperature tuning, which steps every 64 positions
    "mistral3": dict(n_layers=2, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=16, n_ff=96, rope_dim=16,
                     extra={"mistral3.rope.scaling.type": "yarn", "mistral3.rope.scaling.factor": 2.0,
                            "mistral3.rope.scaling.original_context_length": 64,
                            "mistral3.attention.temperature_scale": 0.5}),
    # every fourth layer without RoPE
    "smollm3": dict(n_layers=4, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=16, n_ff=96, rope_dim=16),
    # embedding, residual, attention and logit multipliers
    "granite": dict(n_layers=2, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=16, n_ff=96, rope_dim=16,
                    extra={"granite.embedding_scale": 3.0, "granite.residual_scale": 0.5, "granite.attention.scale": 0.125,
                           "granite.logit_scale": 0.25}),
    # no norms before the blocks, post norms, q/k norms over the whole projections
    "olmo2": dict(n_layers=2, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=16, n_ff=96, rope_dim=16, pre_norms=False,
                  whole_norms=True, post_norms=True, tied=False),
}
K_SCALE_FIELDS = {Q.Q4_K: (0, 2), Q.Q6_K: (208,), Q.IQ4_NL: (0,)}  # byte offsets of the float16 scales in a block
# Q4_0, IQ4_NL, Q4_K and Q8_0 are repacked into 16-row groups under AVX-512 (a fused tensor's row ranges too);
# the Q8_0 output and embedding (300 rows: not whole groups) stay in the file layout
QUANT_TYPES = {"attn_q": Q.Q5_0, "attn_k": Q.Q4_K, "attn_v": Q.IQ4_NL, "attn_qkv": Q.Q4_0, "attn_output": Q.Q4_0,
               "ffn_gate": Q.Q4_K, "ffn_up": Q.Q5_1, "ffn_down": Q.Q6_K, "output": Q.Q8_0, "token_embd": Q.Q8_0}


def write_model(path: Path, name: str, quantized: bool, seed: int = 0, n_vocab: int = N_VOCAB,
                types: dict[str, GGMLQuantizationType] | None = None) -> Path:
    """A tiny random model ``name`` of ARCHS: float32 matrices, or (``quantized``, with n_embd 256) mixed GGML types
    (``types`` over QUANT_TYPES, by tensor kind)."""
    quant_types = {**QUANT_TYPES, **(types or {})}
    spec = dict(ARCHS[name])
    arch = spec.get("arch", name)
    if quantized:  # K-quant rows need 256 elements
        full = spec["rope_dim"] == spec["head_dim"]
        spec.update(n_embd=256, n_ff=512, head_dim=64, rope_dim=64 if full else min(spec["rope_dim"] * 4, 64))
    n_embd, n_heads, n_kv, hd, n_ff = (spec[k] for k in ("n_embd", "n_heads", "n_kv_heads", "head_dim", "n_ff"))
    writer = GGUFWriter(path, arch)
    for key, value in {"block_count": spec["n_layers"], "embedding_length": n_embd, "feed_forward_length": n_ff,
                       "attention.head_count": n_heads, "attention.head_count_kv": n_kv, "attention.key_length": hd,
                       "attention.value_length": hd, "rope.dimension_count": spec["rope_dim"], "context_length": N_CTX}.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float32(f"{arch}.rope.freq_base", 50000.0)
    for key, value in spec.get("extra", {}).items():
        (writer.add_string if isinstance(value, str) else writer.add_float32 if isinstance(value, float)
         else writer.add_uint32)(key, value)
    rng = np.random.default_rng(seed)

    def add(name: str, shape: tuple[int, ...], scale: float = 0.1, offset: float = 0.0):
        values = (offset + scale * rng.standard_normal(shape)).astype(np.float32)
        qtype = quant_types.get(name.split(".")[-2]) if quantized and len(shape) == 2 else None
        if qtype is None:
            writer.add_tensor(name, values)
        elif qtype in K_SCALE_FIELDS:  # gguf cannot quantize K types: random codes under small scales
            writer.add_tensor(name, random_k_blocks(qtype, shape, rng), raw_dtype=qtype)
        else:
            writer.add_tensor(name, quantize(values, qtype), raw_dtype=qtype)

    add("token_embd.weight", (n_vocab, n_embd), 0.5)
    if spec.get("rope_freqs"):
        writer.add_tensor("rope_freqs.weight", rng.uniform(1.0, 4.0, spec["rope_dim"] // 2).astype(np.float32))
    if spec.get("rope_factors"):
        for which in ("long", "short"):
            writer.add_tensor(f"rope_factors_{which}.weight", rng.uniform(1.0, 4.0, spec["rope_dim"] // 2).astype(np.float32))
    for il in range(spec["n_layers"]):
        blk = f"blk.{il}."
        if spec.get("pre_norms", True):
            add(blk + "attn_norm.weight", (n_embd,), 0.1, 1.0)
        if spec.get("fused"):
            add(blk + "attn_qkv.weight", ((n_heads + 2 * n_kv) * hd, n_embd))
        else:
            add(blk + "attn_q.weight", (n_heads * hd, n_embd))
            add(blk + "attn_k.weight", (n_kv * hd, n_embd))
            add(blk + "attn_v.weight", (n_kv * hd, n_embd))
        add(blk + "attn_output.weight", (n_embd, n_heads * hd))
        if spec.get("bias"):
            for proj, rows in (("q", n_heads * hd), ("k", n_kv * hd), ("v", n_kv * hd)):
                add(blk + f"attn_{proj}.bias", (rows,), 0.5)
        if spec.get("qk_norms") or spec.get("whole_norms"):
            q_rows, k_rows = (n_heads * hd, n_kv * hd) if spec.get("whole_norms") else (hd, hd)
            add(blk + "attn_q_norm.weight", (q_rows,), 0.1, 1.0)
            add(blk + "attn_k_norm.weight", (k_rows,), 0.1, 1.0)
        if spec.get("post_norms"):
            add(blk + "post_attention_norm.weight", (n_embd,), 0.1, 1.0)
            add(blk + "post_ffw_norm.weight", (n_embd,), 0.1, 1.0)
        if spec.get("pre_norms", True):
            add(blk + "ffn_norm.weight", (n_embd,), 0.1, 1.0)
        if spec.get("fused"):
            add(blk + "ffn_up.weight", (2 * n_ff, n_embd))
        else:
            add(blk + "ffn_gate.weight", (n_ff, n_embd))
            add(blk + "ffn_up.weight", (n_ff, n_embd))
        add(blk + "ffn_down.weight", (n_embd, n_ff))
    add("output_norm.weight", (n_embd,), 0.1, 1.0)
    if not spec.get("tied", True):
        add("output.weight", (n_vocab, n_embd))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def random_k_blocks(qtype: GGMLQuantizationType, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Packed rows (rows, row_bytes) of random codes whose scales keep the weights around 0.1."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (shape[0], shape[1] // block, type_size), dtype=np.uint8)
    for offset in K_SCALE_FIELDS[qtype]:
        scales = rng.uniform(1e-4, 4e-4, blocks.shape[:2]).astype(np.float16)
        blocks[..., offset:offset + 2] = scales[..., None].view(np.uint8)
    return blocks.reshape(shape[0], -1)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """``model_file(arch, quantized)``: the path of a tiny model, written once per module."""
    written = {}

    def get(arch: str, quantized: bool) -> Path:
        if (arch, quantized) not in written:
            path = tmp_path_factory.mktemp("models") / f"{arch}-{'q' if quantized else 'f32'}.gguf"
            written[arch, quantized] = write_model(path, arch, quantized)
        return written[arch, quantized]

    return get


def backends(path: Path, kv_dtype=np.float32) -> tuple[CpuBackend, NumpyBackend]:
    gguf = read_gguf(path)
    config = ModelConfig.from_gguf(gguf)
    return CpuBackend(gguf, config, kv_dtype=kv_dtype), NumpyBackend(gguf, config)


def prompt(n: int, seed: int = 1, n_vocab: int = N_VOCAB) -> list[int]:
    return np.random.default_rng(seed).integers(0, n_vocab, n).tolist()


@pytest.fixture
def threads():
    """Set the pool's thread count inside a test; restored afterwards."""
    before = kernels.get_threads()
    yield kernels.set_threads
    kernels.set_threads(before)


# -- the decoder's math ---------------------------------------------------------------------------------------

def test_the_tiny_models_exercise_every_switch(model_file):
    configs = {arch: ModelConfig.from_gguf(read_gguf(model_file(arch, False))) for arch in ARCHS}
    assert configs["llama"].has_rope_freqs and configs["llama"].rope_scale == 2.0 and not configs["llama"].rope_neox
    assert configs["qwen2"].qkv_bias and configs["qwen2"].rope_dim < configs["qwen2"].head_dim
    assert not configs["qwen2"].tied_embeddings and configs["qwen2"].n_heads == 4 * configs["qwen2"].n_kv_heads
    g = configs["gemma3"]
    assert g.qk_norm and g.post_norms and g.activation == "gelu_tanh" and g.embed_scale == 8.0
    assert [g.is_sliding(i) for i in range(7)] == [True] * 5 + [False, True] and g.rope_base_local != g.rope_base
    assert g.head_dim * g.n_heads != g.n_embd
    assert configs["llama-yarn"].rope_scaling == "yarn" and configs["llama-yarn"].rope_mscale > 1.0
    assert configs["qwen3"].qk_norm and not configs["qwen3"].post_norms
    g2 = configs["gemma2"]
    assert g2.attn_softcap == 5.0 and g2.final_softcap == 15.0 and [g2.is_sliding(i) for i in range(4)] == [True, False] * 2
    assert configs["phi3"].rope_factors and configs["phi3"].rope_dim < configs["phi3"].head_dim
    m = configs["mistral3"]
    assert m.rope_scaling == "yarn" and m.attn_temp_scale == 0.5 and m.attn_temp_floor == 64
    assert [configs["smollm3"].is_rope_layer(i) for i in range(4)] == [True, True, True, False]
    gr = configs["granite"]
    assert (gr.residual_scale, gr.logit_scale, gr.embed_scale, gr.attn_scale) == (0.5, 4.0, 3.0, 0.125)
    assert not configs["olmo2"].pre_norms and configs["olmo2"].qk_norm_whole


@pytest.mark.parametrize("kv_dtype, tolerance", [(np.float32, 2e-5), (np.float16, 3e-3)])
@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_and_decode_match_the_numpy_reference(model_file, arch, kv_dtype, tolerance):
    """A prompt of several C calls and key chunks (600 > MAX_ROWS, > 2 * 256), then decode steps, far past
    the sliding window; float32 weights leave only float rounding between the two decoders."""
    cpu, ref = backends(model_file(arch, False), kv_dtype)
    cpu_cache, ref_cache = cpu.new_cache(N_CTX), ref.new_cache(N_CTX)
    ids = prompt(600)
    got = cpu.forward(ids, cpu_cache, all_logits=True)
    want = ref.forward(ids, ref_cache, all_logits=True)
    assert got.shape == want.shape == (600, N_VOCAB) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * np.abs(want).max())
    for token in prompt(5, seed=2):
        np.testing.assert_allclose(cpu.forward([token], cpu_cache), ref.forward([token], ref_cache), rtol=0,
                                   atol=tolerance * np.abs(want).max())
    assert cpu_cache.n_past == ref_cache.n_past == 605


@pytest.mark.parametrize("name", SPECS)
def test_synthetic_models_match_the_numpy_reference(tmp_path_factory, name):
    """The llama.cpp parity harness's F32 models (n_embd 256, metadata as llama.cpp reads it): a prompt in two
    calls, then decode steps, at a context that makes LongRoPE take its long factors."""
    path = write_synthetic(tmp_path_factory.mktemp("synthetic") / f"{name}.gguf", SPECS[name])
    gguf = read_gguf(path)
    config = ModelConfig.from_gguf(gguf)
    cpu, ref = CpuBackend(gguf, config, np.float32, n_ctx=256), NumpyBackend(gguf, config, n_ctx=256)
    np.testing.assert_array_equal(cpu.rope_inv_freq, ref.rope_inv_freq)
    cpu_cache, ref_cache = cpu.new_cache(256), ref.new_cache(256)
    ids = np.random.default_rng(2).integers(0, config.n_vocab, 60).tolist()
    for piece in (ids[:20], ids[20:56], *([t] for t in ids[56:])):
        got, want = cpu.forward(piece, cpu_cache, all_logits=True), ref.forward(piece, ref_cache, all_logits=True)
        np.testing.assert_allclose(got, want, rtol=0, atol=5e-5 * np.abs(want).max())


def test_create_backend_gives_the_context_to_longrope(tmp_path):
    """phi3 rotates with its long factors past the original context: the cpu backend must know n_ctx."""
    gguf = read_gguf(write_synthetic(tmp_path / "phi3.gguf", SPECS["phi3"]))
    config = ModelConfig.from_gguf(gguf)
    long_ctx, _ = create_backend("cpu", gguf, config, n_ctx=256)
    short_ctx, _ = create_backend("cpu", gguf, config)  # None: within the original context
    assert isinstance(long_ctx, CpuBackend)
    np.testing.assert_array_equal(long_ctx.rope_inv_freq, NumpyBackend(gguf, config, n_ctx=256).rope_inv_freq)
    assert not np.array_equal(long_ctx.rope_inv_freq, short_ctx.rope_inv_freq)


@pytest.mark.parametrize("arch", ARCHS)
def test_decode_across_the_sliding_window_and_batched_decode_match_the_reference(model_file, arch):
    """Decode steps from a prompt one short of the window across its edge, then one batched step of
    sequences of different lengths (inside, at and past the window), against the reference's batch."""
    cpu, ref = backends(model_file(arch, False), np.float32)
    cpu_cache, ref_cache = cpu.new_cache(N_CTX), ref.new_cache(N_CTX)
    first = cpu.forward(prompt(SLIDING_WINDOW - 1), cpu_cache)
    scale = np.abs(first).max()
    np.testing.assert_allclose(first, ref.forward(prompt(SLIDING_WINDOW - 1), ref_cache), rtol=0, atol=2e-5 * scale)
    for token in prompt(4, seed=4):  # positions window - 1 .. window + 2
        np.testing.assert_allclose(cpu.forward([token], cpu_cache), ref.forward([token], ref_cache), rtol=0,
                                   atol=2e-5 * scale)
    lengths = (3, SLIDING_WINDOW, 3 * SLIDING_WINDOW + 5, 70)
    cpu_caches, ref_caches = [cpu.new_cache(N_CTX) for _ in lengths], [ref.new_cache(N_CTX) for _ in lengths]
    for i, n in enumerate(lengths):
        cpu.forward(prompt(n, seed=10 + i), cpu_caches[i])
        ref.forward(prompt(n, seed=10 + i), ref_caches[i])
    tokens = prompt(len(lengths), seed=5)
    got, want = cpu.forward_batch(tokens, cpu_caches), ref.forward_batch(tokens, ref_caches)
    assert got.shape == (len(lengths), N_VOCAB)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_model_matches_the_reference_with_the_same_products(model_file, arch):
    """With quantized weights the reference decoder running the same C products is the comparison; 8-bit
    activations turn float rounding into small logit differences, but the ranking of the top token holds."""
    cpu, _ = backends(model_file(arch, True))
    ids = prompt(300)
    got = cpu.forward(ids, cpu.new_cache(N_CTX), all_logits=True)
    want = cpu.reference_forward(ids, NumpyKVCache(cpu.config, N_CTX), all_logits=True)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() < 0.05 * scale
    assert np.median(np.abs(got - want)) < 0.005 * scale
    assert (got.argmax(-1) == want.argmax(-1)).mean() > 0.9


@pytest.mark.parametrize("arch, tied", [("llama", None), ("phi3", None), ("llama", Q.Q4_0), ("llama", Q.Q4_K),
                                        ("llama", Q.Q8_0), ("llama", Q.Q6_K)])
def test_repacked_matrices_give_the_file_layouts_bits(model_file, tmp_path, arch, tied, monkeypatch):
    """Under AVX-512 the dense Q4_0 / IQ4_NL / Q4_K / Q8_0 / Q6_K matrices (phi3's fused q/k/v rows; a tied Q4_0,
    Q4_K, Q8_0 or Q6_K embedding, which serves the output and the token rows) are decoded from 16-row copies whose
    mapped pages are released; prompt and decode logits are the file layout's bits."""
    path = write_model(tmp_path / "tied.gguf", arch, True, n_vocab=320, types={"token_embd": tied}) \
        if tied else model_file(arch, True)
    cpu, _ = backends(path)
    with monkeypatch.context() as m:
        m.setattr(kernels, "repack16_type", lambda qtype, rows: None)
        plain, _ = backends(path)
    repacks = kernels.active_isa() == "avx512"
    assert bool(cpu.decoder._copies) == repacks and not plain.decoder._copies
    gguf, names = cpu.gguf, [n for n, t in cpu.gguf.tensors.items()
                             if t.qtype in (Q.Q4_0, Q.IQ4_NL, Q.Q4_K, Q.Q8_0, Q.Q6_K) and t.shape[-1] % 16 == 0]
    assert (tied is not None) == ("token_embd.weight" in names)
    mapped = sum(end - start for start, end in gguf.mapped_ranges())
    assert mapped == sum(t.nbytes for t in gguf.tensors.values()) - repacks * sum(gguf.tensor(n).nbytes for n in names)
    n_vocab = cpu.config.n_vocab
    for backend in (cpu, plain):
        cache = backend.new_cache(N_CTX)
        backend.logits = [backend.forward(prompt(70, n_vocab=n_vocab), cache, all_logits=True)]
        backend.logits += [backend.forward([t], cache) for t in prompt(3, seed=2, n_vocab=n_vocab)]
    for got, want in zip(cpu.logits, plain.logits, strict=True):
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("arch", ARCHS)
def test_decode_steps_equal_the_rows_of_one_pass_bit_for_bit(model_file, arch, kv_dtype):
    """Speculative verification rests on this: k rows in one call give the logits (and keys) of k steps."""
    cpu, _ = backends(model_file(arch, True), kv_dtype)
    ids, drafted = prompt(270), prompt(6, seed=3)
    stepped, verified = cpu.new_cache(N_CTX), cpu.new_cache(N_CTX)
    cpu.forward(ids, stepped)
    cpu.forward(ids, verified)
    rows = cpu.forward(drafted, verified, all_logits=True)
    for j, token in enumerate(drafted):
        np.testing.assert_array_equal(cpu.forward([token], stepped), rows[j])
    np.testing.assert_array_equal(stepped.k[:, :, :stepped.n_past], verified.k[:, :, :verified.n_past])


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_batch_equals_separate_steps(model_file, arch):
    cpu, _ = backends(model_file(arch, True))
    caches, alone = [], []
    for i, n in enumerate((5, 40, 300)):
        for group in (caches, alone):
            cache = cpu.new_cache(N_CTX) if i != 1 else CpuKVCache(cpu.config, N_CTX, np.float16)  # mixed dtypes
            cpu.forward(prompt(n, seed=i), cache)
            group.append(cache)
    tokens = [7, 8, 9]
    batched = cpu.forward_batch(tokens, caches)
    assert batched.shape == (3, N_VOCAB)
    for row, token, cache in zip(batched, tokens, alone):
        np.testing.assert_array_equal(row, cpu.forward([token], cache))
    assert [c.n_past for c in caches] == [6, 41, 301]


@pytest.mark.parametrize("arch", ["gemma3", "gemma2", "mistral3"])
def test_thread_count_changes_nothing(model_file, threads, arch):
    cpu, _ = backends(model_file(arch, True), np.float16)
    ids = prompt(400)
    results = []
    for n in (1, 2, 3):
        threads(n)
        cache = cpu.new_cache(N_CTX)
        rows = cpu.forward(ids, cache, all_logits=True)
        results.append((rows, cpu.forward([5], cache), cpu.forward_batch([6], [cache])))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


# -- the KV cache -----------------------------------------------------------------------------------------------

def test_cache_grows_in_steps_truncates_and_recomputes_the_same(model_file):
    cpu, _ = backends(model_file("gemma3", True))
    cache = cpu.new_cache(1000)
    assert cache.capacity == GROWTH_STEP and cache.nbytes == cache.k.nbytes + cache.v.nbytes
    ids = prompt(GROWTH_STEP + 10)
    full = cpu.forward(ids, cache, all_logits=True)
    assert cache.capacity == 2 * GROWTH_STEP and cache.n_past == len(ids)
    cache.truncate(100)
    np.testing.assert_array_equal(cpu.forward(ids[100:], cache, all_logits=True), full[100:])
    with pytest.raises(ValueError):
        cache.truncate(cache.n_past + 1)


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
def test_state_round_trips_in_the_neutral_float32_layout(model_file, kv_dtype):
    cpu, ref = backends(model_file("qwen2", False), kv_dtype)
    cache = cpu.new_cache(64)
    cpu.forward(prompt(20), cache)
    state = cache.export_state()
    c = cpu.config
    assert state.n_past == 20 and len(state.keys) == len(state.values) == c.n_layers
    assert all(k.dtype == np.float32 and k.shape == (c.n_kv_heads, 20, c.head_dim) for k in state.keys)
    other, ref_cache = cpu.new_cache(64), ref.new_cache(64)
    other.import_state(state)
    ref_cache.import_state(state)  # across backends: the reference continues from the C decoder's state
    continued = cpu.forward([7], other)
    np.testing.assert_array_equal(continued, cpu.forward([7], cache))
    np.testing.assert_allclose(ref.forward([7], ref_cache), continued, atol=5e-3)
    back = cpu.new_cache(64)  # and the C decoder from the reference's
    back.import_state(ref_cache.export_state())
    np.testing.assert_allclose(cpu.forward([11], back), ref.forward([11], ref_cache), atol=5e-3)


def test_import_refuses_a_state_of_another_shape(model_file):
    cpu, _ = backends(model_file("llama", False))
    c = cpu.config
    bad = KVState([np.zeros((c.n_kv_heads, 3, c.head_dim + 1), np.float32)] * c.n_layers,
                  [np.zeros((c.n_kv_heads, 3, c.head_dim), np.float32)] * c.n_layers, 3)
    with pytest.raises(ValueError, match="do not fit"):
        cpu.new_cache(16).import_state(bad)
    with pytest.raises(ValueError, match="layers"):
        cpu.new_cache(16).import_state(KVState([], [], 0))


# -- errors -----------------------------------------------------------------------------------------------------

def test_errors_are_clear_and_leave_the_cache_untouched(model_file):
    cpu, _ = backends(model_file("llama", True))
    cache = cpu.new_cache(8)
    cpu.forward(prompt(6), cache)
    with pytest.raises(ValueError, match="out of range"):
        cpu.forward([N_VOCAB], cache)
    with pytest.raises(ValueError, match="out of range"):
        cpu.forward([2**32 + 5], cache)  # would wrap to a valid id in int32
    with pytest.raises(ValueError, match="at least one token"):
        cpu.forward([], cache)
    assert cache.n_past == 6
    with pytest.raises(ValueError, match="context is full"):
        cpu.forward([1, 2, 3], cache)
    with pytest.raises(ValueError, match="same cache twice"):
        cpu.forward_batch([1, 2], [cache, cache])
    with pytest.raises(ValueError, match="one token per cache"):
        cpu.forward_batch([1, 2], [cache])
    with pytest.raises(TypeError, match="new_cache"):
        cpu.forward([1], NumpyKVCache(cpu.config, 8))
    assert cache.n_past == 6
    fresh = cpu.new_cache(8)
    cpu.forward(prompt(6), fresh)
    np.testing.assert_array_equal(cpu.forward([1, 2], cache), cpu.forward([1, 2], fresh))


def test_the_handle_refuses_rope_tables_it_cannot_use(model_file):
    """RoPE sets are rows of the table or -1; the C side checks what Python hands it."""
    cpu, _ = backends(model_file("smollm3", False))
    c = cpu.config
    args = (c, cpu.layers, (cpu.token_embd, int(cpu.token_embd_type)), cpu.output, cpu.output_norm)
    assert cpu.rope_layer_set == [0, 0, 0, -1]
    with pytest.raises(ValueError, match="RoPE set"):
        CpuDecoder(*args, cpu.rope_inv_freq, [0, 1, 0, -1])  # one set only
    with pytest.raises(ValueError, match="RoPE set"):
        CpuDecoder(*args, cpu.rope_inv_freq, [0, 0, -2, 0])
    with pytest.raises(ValueError, match="inv_freq"):
        CpuDecoder(*args, np.ones((9, c.rope_dim // 2)), [0] * c.n_layers)
    with pytest.raises(ValueError, match="layer_set"):
        CpuDecoder(*args, cpu.rope_inv_freq, [0])
    assert CpuDecoder(*args, np.ones((8, c.rope_dim // 2)), [7, 6, 5, -1]).scratch_bytes > 0


def test_a_cache_of_another_model_is_refused(model_file):
    llama, _ = backends(model_file("llama", False))
    gemma, _ = backends(model_file("gemma3", False))
    with pytest.raises(ValueError, match="wrong type or shape"):
        llama.forward([1], gemma.new_cache(8))


def test_memory_reports_caches_and_scratch(model_file):
    cpu, _ = backends(model_file("qwen2", True))
    before = cpu.memory()
    cache = cpu.new_cache(1000)
    cpu.forward(prompt(300), cache)
    after = cpu.memory()
    assert before.kv_cache_bytes == 0 and after.kv_cache_bytes == cache.nbytes > 0
    assert after.scratch_bytes > 0 and after.weights_bytes == cpu.gguf.file_size
    del cache
    assert cpu.memory().kv_cache_bytes == 0


# -- the portable ISA and real models -------------------------------------------------------------------------

SCALAR_SCRIPT = """
import json, sys
import numpy as np
from engine.backends.cpu import kernels
from tests.engine.test_cpu_decoder import backends, prompt, N_CTX
cpu, ref = backends(sys.argv[1], np.float16)
ids = prompt(300)
got = cpu.forward(ids, cpu.new_cache(N_CTX), all_logits=True)
want = ref.forward(ids, ref.new_cache(N_CTX), all_logits=True)
print(json.dumps({"isa": kernels.active_isa(), "error": float(np.abs(got - want).max() / np.abs(want).max())}))
"""


@pytest.mark.parametrize("arch", ARCHS)
def test_the_portable_isa_runs_the_same_decoder(model_file, arch):
    env = {**os.environ, kernels.ISA_ENV: "scalar", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", SCALAR_SCRIPT, str(model_file(arch, False))], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout)
    assert result["isa"] == "scalar" and result["error"] < 3e-3


@pytest.mark.slow
def test_real_model_parity_on_the_portable_isa():
    """A machine without AVX2: SmolLM2's teacher-forced parity with llama.cpp on the scalar kernels."""
    env = {**os.environ, kernels.ISA_ENV: "scalar"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/engine/test_parity.py",
                          "-k", "teacher_forced and cpu and smollm2"], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout[-2000:]


RSS_SCRIPT = """
import json, sys
import psutil
import numpy as np
from engine.gguf_file import read_gguf
from engine.config import ModelConfig
from engine.backends.cpu_backend import CpuBackend
process = psutil.Process()
gguf = read_gguf(sys.argv[1])
config = ModelConfig.from_gguf(gguf)
before = process.memory_info().rss
backend = CpuBackend(gguf, config)
cache = backend.new_cache(640)
token = int(np.argmax(backend.forward(list(range(100, 612)), cache)))
for _ in range(16):
    token = int(np.argmax(backend.forward([token], cache)))
print(json.dumps({"growth": process.memory_info().rss - before, "file": gguf.file_size, "kv": cache.nbytes}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_loading_maps_the_weights_without_copying_them(name):
    """Resident memory added by the backend, a 512-token prompt and decode: the touched file, the KV cache and
    the scratch, within 1.15 times the file size plus the cache."""
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(model_path(name))], cwd=REPO, capture_output=True,
                         text=True, timeout=600, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    m = json.loads(out.stdout)
    assert m["growth"] <= 1.15 * m["file"] + m["kv"], m
