"""The MLX decoder's architecture blocks against the NumPy reference: on the synthetic model of every architecture
variant (tests/engine/synthetic, as llama.cpp loads them) and on tiny random models of this file, which add quantized
fused tensors, a decode across a sliding-window boundary and, for each block, a check that switching it off changes
the logits (so the agreement is not vacuous). Prefill in chunks, decode, batched decode; float32 and float16."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from engine.backends.mlx_backend import MlxBackend, softcapped_attention
from engine.backends.mlx.weights import DenseMatrix, QuantizedMatrix, SymmetricMatrix
from engine.backends.numpy_backend import NumpyBackend
from engine.config import ModelConfig
from engine.gguf_file import read_gguf
from tests.engine.synthetic.specs import SPECS
from tests.engine.synthetic.writer import write_synthetic

pytestmark = pytest.mark.mlx
Q = GGMLQuantizationType
N_EMBD, N_HEADS, N_KV_HEADS, HEAD_DIM, N_FF, N_VOCAB, N_LAYERS = 64, 4, 2, 32, 96, 300, 4
WINDOW = 8
FLOAT32_TOLERANCE = 2e-4  # float32 against float32 on the same (exactly repacked) weights
FLOAT16_TOLERANCE = 0.05  # float16 rounding of activations, products and the KV cache, per unit of the logits' std
SYNTHETIC_F32_TOLERANCE = 1e-4  # per unit of the logits' std: float32 sums in another order, 256-wide rows

# architecture -> metadata beyond the shapes (keys without the "<arch>." prefix); each sets the fields it exercises
ARCH_METADATA = {
    "qwen3": {"rope.freq_base": 1e6},
    "gemma2": {"attn_logit_softcapping": 1.0, "final_logit_softcapping": 2.0, "attention.sliding_window": WINDOW,
               "rope.freq_base": 1e5, "rope.freq_base_swa": 1e4},
    "phi3": {"rope.dimension_count": 16, "rope.scaling.type": "longrope", "rope.scaling.attn_factor": 1.2,
             "rope.scaling.original_context_length": 256, "context_length": 4096},
    "mistral3": {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.freq_base": 1e6,
                 "rope.scaling.original_context_length": 16, "attention.temperature_scale": 0.5},
    "smollm3": {"rope.freq_base": 2e6},
    "granite": {"logit_scale": 2.0, "residual_scale": 0.5, "embedding_scale": 3.0, "attention.scale": 0.1},
    "olmo2": {"rope.freq_base": 5e5},
    "llama": {"rope.scaling.type": "yarn", "rope.scaling.factor": 8.0, "rope.scaling.original_context_length": 32,
              "rope.freq_base": 5e5},
}


def write_arch_model(path: Path, arch: str, seed: int = 0) -> Path:
    """A random-weight ``arch`` model with the tensors llama.cpp's loader names for it, without tokenizer.

    Matrices are Q8_0 (repacked exactly), some Q4_1 (with biases) and F16 (dense); phi3 fuses q/k/v in
    ``attn_qkv`` (F16) and gate/up in ``ffn_up`` (Q4_1), so both fused forms load as row ranges.
    """
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path, arch)
    meta = {"context_length": 4096, "embedding_length": N_EMBD, "block_count": N_LAYERS, "feed_forward_length": N_FF,
            "attention.head_count": N_HEADS, "attention.head_count_kv": N_KV_HEADS, "attention.key_length": HEAD_DIM,
            "attention.value_length": HEAD_DIM, "attention.layer_norm_rms_epsilon": 1e-6} | ARCH_METADATA[arch]
    for key, value in meta.items():
        if isinstance(value, str):
            w.add_string(f"{arch}.{key}", value)
        elif isinstance(value, int):
            w.add_uint32(f"{arch}.{key}", value)
        else:
            w.add_float32(f"{arch}.{key}", value)

    def matrix(name, rows, cols, qtype=Q.Q8_0, std=0.08):
        values = std * rng.standard_normal((rows, cols)).astype(np.float32)
        if qtype == Q.F16:
            w.add_tensor(name, values.astype(np.float16))
        else:
            w.add_tensor(name, quantize(values, qtype), raw_dtype=qtype)

    def vector(name, n, mean=1.0, spread=0.1):
        w.add_tensor(name, (mean + spread * rng.standard_normal(n)).astype(np.float32))

    n_q, n_kv = N_HEADS * HEAD_DIM, N_KV_HEADS * HEAD_DIM
    matrix("token_embd.weight", N_VOCAB, N_EMBD, std=0.5 if arch != "gemma2" else 0.1)
    if arch == "olmo2":  # llama.cpp requires olmo2's output
        matrix("output.weight", N_VOCAB, N_EMBD, Q.F16)
    for i in range(N_LAYERS):
        blk = f"blk.{i}."
        if arch == "phi3":
            matrix(blk + "attn_qkv.weight", n_q + 2 * n_kv, N_EMBD, Q.F16)
            matrix(blk + "ffn_up.weight", 2 * N_FF, N_EMBD, Q.Q4_1)
        else:
            matrix(blk + "attn_q.weight", n_q, N_EMBD)
            matrix(blk + "attn_k.weight", n_kv, N_EMBD, Q.Q4_1)
            matrix(blk + "attn_v.weight", n_kv, N_EMBD)
            matrix(blk + "ffn_gate.weight", N_FF, N_EMBD, Q.Q4_1)
            matrix(blk + "ffn_up.weight", N_FF, N_EMBD)
        matrix(blk + "attn_output.weight", N_EMBD, n_q)
        matrix(blk + "ffn_down.weight", N_EMBD, N_FF)
        norms = [] if arch == "olmo2" else [("attn_norm", N_EMBD), ("ffn_norm", N_EMBD)]
        if arch in ("gemma2", "olmo2"):
            norms += [("post_attention_norm", N_EMBD), ("post_ffw_norm", N_EMBD)]
        if arch == "qwen3":
            norms += [("attn_q_norm", HEAD_DIM), ("attn_k_norm", HEAD_DIM)]
        if arch == "olmo2":
            norms += [("attn_q_norm", n_q), ("attn_k_norm", n_kv)]
        for name, n in norms:
            vector(f"{blk}{name}.weight", n)
    vector("output_norm.weight", N_EMBD)
    if arch == "phi3":
        vector("rope_factors_short.weight", 8, mean=1.5, spread=0.3)
        vector("rope_factors_long.weight", 8, mean=6.0, spread=2.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


ARCHS = tuple(ARCH_METADATA)


@pytest.fixture(scope="module")
def arch_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("archs")
    return {arch: write_arch_model(folder / f"tiny-{arch}.gguf", arch) for arch in ARCHS}


def load_pair(path: Path, matmul_dtype=None, n_ctx: int | None = None, **changes) -> tuple[MlxBackend, NumpyBackend]:
    """Both backends on one file; ``changes`` override config fields in both (to switch a block off)."""
    gguf = read_gguf(path)
    config = dataclasses.replace(ModelConfig.from_gguf(gguf), **changes)
    return MlxBackend(gguf, config, matmul_dtype, n_ctx=n_ctx), NumpyBackend(gguf, config, n_ctx=n_ctx)


def token_ids(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, N_VOCAB, n).tolist()


def run_in_chunks(backend, ids: list[int], cuts: tuple[int, ...], n_decode: int) -> np.ndarray:
    """All logits of ``ids`` prefilled in pieces split at ``cuts``, then ``n_decode`` single-token steps
    (feeding ``ids`` backwards)."""
    cache = backend.new_cache(len(ids) + n_decode + 1)
    bounds = (0, *cuts, len(ids))
    out = [backend.forward(ids[a:b], cache, all_logits=True) for a, b in zip(bounds, bounds[1:])]
    out += [backend.forward([t], cache)[None] for t in ids[::-1][:n_decode]]
    return np.concatenate(out)


def batched_decode(backend, prompts: list[list[int]], steps: list[list[int]]) -> np.ndarray:
    """Logits (len(steps), B, n_vocab) of decode steps batched over caches prefilled with ``prompts``."""
    caches = [backend.new_cache(64) for _ in prompts]
    for prompt, cache in zip(prompts, caches):
        backend.forward(prompt, cache)
    return np.stack([backend.forward_batch(step, caches) for step in steps])


# -- the synthetic model of every architecture variant ------------------------------------------------------------
SYNTHETIC_N_CTX = 256  # as test_arch_parity loads them: past the LongRoPE variant's original context (long factors)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """name -> (path, the NumPy reference's chunked and batched logits), each made once for both dtypes."""
    folder, made = tmp_path_factory.mktemp("synthetic"), {}

    def get(name: str):
        if name not in made:
            path = write_synthetic(folder / f"{name}.gguf", SPECS[name])
            gguf = read_gguf(path)
            ref = NumpyBackend(gguf, ModelConfig.from_gguf(gguf), n_ctx=SYNTHETIC_N_CTX)
            made[name] = path, run_in_chunks(ref, SYNTHETIC_IDS, (20,), 4), batched_decode(ref, *SYNTHETIC_BATCH)
        return made[name]
    return get


SYNTHETIC_N_CTX = 256  # as test_arch_parity loads them: past the LongRoPE variant's original context (long factors)
SYNTHETIC_IDS = np.random.default_rng(8).integers(0, 256, 56).tolist()
SYNTHETIC_BATCH = ([SYNTHETIC_IDS[:5], SYNTHETIC_IDS[:30], SYNTHETIC_IDS[10:50]],  # prompts, then two batched steps
                   [SYNTHETIC_IDS[50:53], SYNTHETIC_IDS[53:56]])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", list(SPECS))
def test_synthetic_model_matches_numpy(name, dtype, synthetic):
    """Chunked prefill over the sliding window and the YaRN / temperature floors, decode, and batched decode."""
    path, want, want_batched = synthetic(name)
    gguf = read_gguf(path)
    ours = MlxBackend(gguf, ModelConfig.from_gguf(gguf), getattr(mx, dtype), n_ctx=SYNTHETIC_N_CTX)
    tolerance = (SYNTHETIC_F32_TOLERANCE if dtype == "float32" else FLOAT16_TOLERANCE) * float(want.std())
    got = run_in_chunks(ours, SYNTHETIC_IDS, (20,), 4)
    np.testing.assert_allclose(got, want, atol=tolerance, rtol=0)
    np.testing.assert_allclose(batched_decode(ours, *SYNTHETIC_BATCH), want_batched, atol=tolerance, rtol=0)


# -- the config of each model exercises its blocks ---------------------------------------------------------
def test_the_tiny_models_set_the_fields_they_are_here_for(arch_files):
    c = {arch: ModelConfig.from_gguf(read_gguf(path)) for arch, path in arch_files.items()}
    assert c["qwen3"].qk_norm and not c["qwen3"].qk_norm_whole
    assert c["gemma2"].attn_softcap == 1.0 and c["gemma2"].final_softcap == 2.0
    assert [c["gemma2"].is_sliding(i) for i in range(N_LAYERS)] == [True, False, True, False]
    assert c["phi3"].rope_factors and c["phi3"].rope_dim == 16 and c["phi3"].rope_mscale == pytest.approx(1.2)
    assert c["mistral3"].attn_temp_scale == 0.5 and c["mistral3"].attn_temp_floor == 16
    assert c["mistral3"].rope_scaling == "yarn" and c["mistral3"].rope_mscale > 1.0
    assert [c["smollm3"].is_rope_layer(i) for i in range(N_LAYERS)] == [True, True, True, False]
    assert (c["granite"].residual_scale, c["granite"].logit_scale, c["granite"].embed_scale) == (0.5, 0.5, 3.0)
    assert not c["olmo2"].pre_norms and c["olmo2"].qk_norm_whole and c["olmo2"].post_norms
    assert c["llama"].rope_scaling == "yarn" and not c["llama"].rope_neox


def test_fused_tensors_load_as_row_ranges_of_one_array(arch_files):
    ours, _ = load_pair(arch_files["phi3"])
    layer = ours.layers[0]
    assert isinstance(layer.wq, DenseMatrix) and isinstance(layer.w_gate, QuantizedMatrix)
    assert [m.weight.shape[0] for m in (layer.wq, layer.wk, layer.wv)] == [N_HEADS * HEAD_DIM] + [N_KV_HEADS * HEAD_DIM] * 2
    assert layer.w_gate.packed.shape[0] == layer.w_up.packed.shape[0] == N_FF
    assert ours.weights_nbytes() > 0


# -- agreement with the NumPy reference ------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_in_chunks_then_decode_matches_numpy(arch, arch_files):
    """Three prefill chunks (the first shorter than the window, the others past it), then decode steps."""
    ours, ref = load_pair(arch_files[arch])
    ids = token_ids(60, seed=1)
    got, want = run_in_chunks(ours, ids, (5, 23), 4), run_in_chunks(ref, ids, (5, 23), 4)
    assert got.shape == want.shape == (64, N_VOCAB) and got.dtype == np.float32
    assert want.std() > 0.3  # logits that differ between tokens, so the comparison means something
    np.testing.assert_allclose(got, want, atol=FLOAT32_TOLERANCE, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_logits_of_the_last_position_only_match_numpy(arch, arch_files):
    """forward without all_logits runs the last layer for the last query only."""
    ours, ref = load_pair(arch_files[arch])
    ids = token_ids(40, seed=2)
    np.testing.assert_allclose(ours.forward(ids, ours.new_cache(40)), ref.forward(ids, ref.new_cache(40)),
                               atol=FLOAT32_TOLERANCE, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_decode_matches_numpy(arch, arch_files):
    """Rows at different positions: RoPE offsets, temperature factors and sliding masks per row."""
    ours, ref = load_pair(arch_files[arch])
    prompts = [token_ids(n, seed=n) for n in (3, 20, 37)]
    caches, ref_caches = [ours.new_cache(48) for _ in prompts], [ref.new_cache(48) for _ in prompts]
    for prompt, cache, ref_cache in zip(prompts, caches, ref_caches):
        ours.forward(prompt, cache)
        ref.forward(prompt, ref_cache)
    for step in ([4, 5, 6], [7, 8, 9]):
        np.testing.assert_allclose(ours.forward_batch(step, caches), ref.forward_batch(step, ref_caches),
                                   atol=FLOAT32_TOLERANCE, rtol=0)
    assert [cache.n_past for cache in caches] == [5, 22, 39]


@pytest.mark.parametrize("arch", ARCHS)
def test_float16_products_match_numpy(arch, arch_files):
    """The GPU's default compute dtype (checked here on the CPU device), over a prefill and decode steps."""
    ours, ref = load_pair(arch_files[arch], matmul_dtype=mx.float16)
    ids = token_ids(40, seed=3)
    got, want = run_in_chunks(ours, ids, (17,), 3), run_in_chunks(ref, ids, (17,), 3)
    np.testing.assert_allclose(got, want, atol=FLOAT16_TOLERANCE * max(1.0, float(want.std())), rtol=0)


def test_decode_one_token_at_a_time_across_the_sliding_window(arch_files):
    """Gemma 2 (alternating sliding layers, soft-capped scores): every step from inside the window to past it."""
    ours, ref = load_pair(arch_files["gemma2"])
    cache, ref_cache = ours.new_cache(32), ref.new_cache(32)
    ours.forward([1, 2, 3], cache)
    ref.forward([1, 2, 3], ref_cache)
    for token in token_ids(3 * WINDOW, seed=4):
        np.testing.assert_allclose(ours.forward([token], cache), ref.forward([token], ref_cache),
                                   atol=FLOAT32_TOLERANCE, rtol=0, err_msg=f"position {cache.n_past - 1}")
    assert cache.n_past == 3 + 3 * WINDOW


@pytest.mark.parametrize("n_ctx", [None, 4096])
def test_longrope_factors_follow_the_context_size(n_ctx, arch_files):
    """phi3 rotates with the short factors up to the original context (256) and the long ones beyond."""
    ours, ref = load_pair(arch_files["phi3"], n_ctx=n_ctx)
    other, _ = load_pair(arch_files["phi3"], n_ctx=4096 if n_ctx is None else None)
    ids = token_ids(30, seed=5)
    got = ours.forward(ids, ours.new_cache(30), all_logits=True)
    np.testing.assert_allclose(got, ref.forward(ids, ref.new_cache(30), all_logits=True), atol=FLOAT32_TOLERANCE, rtol=0)
    assert np.abs(got - other.forward(ids, other.new_cache(30), all_logits=True)).max() > 0.01


# -- each block changes the output (so the agreement above tests it) --------------------------------------------
BLOCK_SWITCHES = [
    ("gemma2", {"attn_softcap": 0.0}),
    ("gemma2", {"final_softcap": 0.0}),
    ("granite", {"residual_scale": 1.0}),
    ("granite", {"logit_scale": 1.0}),
    ("mistral3", {"attn_temp_scale": 0.0}),
    ("mistral3", {"rope_mscale": 1.0}),
    ("phi3", {"rope_mscale": 1.0}),
    ("smollm3", {"no_rope_every": 0}),
]


@pytest.mark.parametrize("arch, switch", BLOCK_SWITCHES, ids=[f"{a}-{next(iter(s))}" for a, s in BLOCK_SWITCHES])
def test_each_block_changes_the_logits_in_both_decoders(arch, switch, arch_files):
    """With the block switched off both decoders still agree, and differ from the model with it on."""
    ids = token_ids(40, seed=6)
    on, _ = load_pair(arch_files[arch])
    off, ref_off = load_pair(arch_files[arch], **switch)
    with_block = on.forward(ids, on.new_cache(40), all_logits=True)
    without = off.forward(ids, off.new_cache(40), all_logits=True)
    np.testing.assert_allclose(without, ref_off.forward(ids, ref_off.new_cache(40), all_logits=True),
                               atol=FLOAT32_TOLERANCE, rtol=0)
    assert np.abs(with_block - without).max() > 0.01


# -- the explicit attention path ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mask", [None, "causal", "bool"])
def test_softcapped_attention_with_a_far_cap_is_mlx_attention(mask):
    rng = np.random.default_rng(7)
    q = mx.array(rng.standard_normal((1, 8, 5, 16)).astype(np.float32))
    keys = mx.array(rng.standard_normal((1, 2, 12, 16)).astype(np.float32))
    values = mx.array(rng.standard_normal((1, 2, 12, 24)).astype(np.float32))
    if mask == "bool":
        mask = mx.array(rng.random((5, 12)) > 0.3)
    want = mx.fast.scaled_dot_product_attention(q, keys, values, scale=0.25, mask=mask)
    np.testing.assert_allclose(np.array(softcapped_attention(q, keys, values, 0.25, 1e6, mask)), np.array(want),
                               atol=1e-5, rtol=0)
    capped = np.array(softcapped_attention(q, keys, values, 0.25, 0.5, mask))
    assert np.abs(capped - np.array(want)).max() > 0.01
