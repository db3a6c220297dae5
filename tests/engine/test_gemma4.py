"""gemma4 (dense) on a synthetic model: parity with llama.cpp in F32, Q8_0 and Q4_K_M over a prefill split into
several chunks and decode steps across the sliding window on numpy, cpu (the NumPy decoder with the C products)
and mlx; the config fields and layer geometry; refusal of malformed files; batched decode; cache snapshots; and
the real Gemma 4 chat template.

The synthetic model (tests/engine/synthetic/gemma4.py) has every block gemma4 adds to gemma3: sliding and full
layers of different head widths, proportional RoPE on the full layers, the value norm, a layer whose keys are
its values, shared-KV layers, per-layer embeddings, the layer output scale, and KV heads and FFN widths given
per layer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import engine.backends.mlx_backend
import engine.backends.numpy_backend
import engine.model
from engine.backends.cpu_backend import CpuBackend
from engine.backends.numpy_backend import NumpyBackend
from engine.config import ModelConfig
from engine.gguf_file import ModelFormatError, read_gguf
from tests.engine.synthetic import gemma4 as g4
from tests.engine.synthetic.quantize import quantize, tensor_types
from tests.llama_cpp_sources import chat_template

N_CTX = 256
SEQUENCE = np.random.default_rng(4).integers(0, 267, 64).tolist()
PIECES = (20, 36) + (1,) * 8  # prompt chunk, the rest of the prompt, then decode steps (all past the window)
SMALL_CHUNK = 16  # the prompt pieces are cut into forward chunks of this many tokens: several chunks each
FILE_TYPES = {"F32": "F32", "Q8_0": "Q8_0", "Q4_K_M": "Q4_K"}
F32_TOLERANCE = 0.05
BACKENDS = ("numpy", "cpu", "mlx")


def _pieces(ids: list[int]):
    start = 0
    for size in PIECES:
        yield ids[start:start + size]
        start += size


@pytest.fixture(scope="module")
def gemma4_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("gemma4")
    g4.write_gemma4(directory / "gemma4-F32.gguf")
    g4.write_gemma4(directory / "gemma4-moe-F32.gguf", moe=True)
    return directory


_FILES: dict[str, Path] = {}
_REFERENCE: dict[str, np.ndarray] = {}
VARIANTS = ("gemma4", "gemma4-moe")  # dense, and with experts beside the dense FFN (the 26B-A4B layout)


def _model_file(directory: Path, variant: str, ftype: str) -> Path:
    key = f"{variant}-{ftype}"
    if key not in _FILES:
        src = directory / f"{variant}-F32.gguf"
        _FILES[key] = src if ftype == "F32" else quantize(src, directory / f"{key}.gguf", ftype)
    return _FILES[key]


def _llama_cpp(path: Path, key: str) -> np.ndarray:
    if key not in _REFERENCE:
        import llama_cpp

        llm = llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, logits_all=True, n_threads=2, verbose=False)
        try:
            for piece in _pieces(SEQUENCE):
                llm.eval(piece)
            _REFERENCE[key] = np.array(llm.scores[:len(SEQUENCE)], dtype=np.float32)
        finally:
            llm.close()
    return _REFERENCE[key]


def _backend(name: str, path: Path):
    gguf = read_gguf(path)
    config = ModelConfig.from_gguf(gguf)
    if name == "numpy":
        return NumpyBackend(gguf, config, n_ctx=N_CTX)
    if name == "cpu":
        return CpuBackend(gguf, config, n_ctx=N_CTX)
    import mlx.core as mx
    from engine.backends.mlx_backend import MlxBackend

    return MlxBackend(gguf, config, mx.float32, n_ctx=N_CTX)


@pytest.mark.parametrize("ftype", list(FILE_TYPES))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_match_llama_cpp(gemma4_dir, variant, backend, ftype, monkeypatch):
    """The issue's criterion (argmax where llama.cpp's top-2 gap >= 0.5, top-10 logits within max(1, 5 % of
    the std)) on 64 teacher-forced tokens; F32 is held to 0.05 on every logit."""
    monkeypatch.setattr(engine.backends.numpy_backend, "PREFILL_CHUNK", SMALL_CHUNK)
    monkeypatch.setattr(engine.backends.mlx_backend, "MAX_CHUNK", SMALL_CHUNK)
    path = _model_file(gemma4_dir, variant, ftype)
    assert FILE_TYPES[ftype] in tensor_types(path)
    ref = _llama_cpp(path, f"{variant}-{ftype}")
    model = _backend(backend, path)
    cache = model.new_cache(N_CTX)
    ours = np.concatenate([model.forward(piece, cache, all_logits=True) for piece in _pieces(SEQUENCE)])
    assert ours.shape == ref.shape
    std = float(ref.std(axis=1).mean())
    assert std >= 2.0, f"the synthetic model's logits are too flat to test (std {std:.2f})"
    if ftype == "F32":
        error = np.abs(ours - ref).max(axis=1)
        assert error.max() <= F32_TOLERANCE, f"position {int(error.argmax())}: logits differ by {error.max():.4f}"
    top10 = np.argsort(ref, axis=1)[:, -10:]
    error = np.abs(np.take_along_axis(ours, top10, 1) - np.take_along_axis(ref, top10, 1)).max(axis=1)
    tolerance = max(1.0, 0.05 * std)
    assert error.max() <= tolerance, f"position {int(error.argmax())}: top-10 logits differ by {error.max():.3f}"
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) >= 0.5
    mismatched = np.flatnonzero(clear & (ours.argmax(axis=1) != ref.argmax(axis=1)))
    assert mismatched.size == 0, f"argmax differs at positions {mismatched.tolist()}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_last_position_only_matches_all_logits(gemma4_dir, backend):
    """``forward`` without all_logits (MLX runs the last layer for the last query only) gives the last row."""
    model = _backend(backend, gemma4_dir / "gemma4-F32.gguf")
    every = model.forward(SEQUENCE[:40], model.new_cache(N_CTX), all_logits=True)
    last = model.forward(SEQUENCE[:40], model.new_cache(N_CTX))
    np.testing.assert_allclose(last, every[-1], atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("backend", ["numpy", "mlx"])
def test_batched_decode_matches_one_sequence_at_a_time(gemma4_dir, backend):
    model = _backend(backend, gemma4_dir / "gemma4-F32.gguf")
    caches, alone = [], []
    for prompt in (SEQUENCE[:40], SEQUENCE[10:31]):
        cache = model.new_cache(N_CTX)
        model.forward(prompt, cache)
        caches.append(cache)
        single = model.new_cache(N_CTX)
        model.forward(prompt, single)
        alone.append(model.forward([7], single))
    np.testing.assert_allclose(model.forward_batch([7, 7], caches), np.stack(alone), atol=2e-3, rtol=1e-4)


def test_config_reads_gemma4(gemma4_dir):
    c = ModelConfig.from_gguf(read_gguf(gemma4_dir / "gemma4-F32.gguf"))
    assert [c.is_sliding(il) for il in range(c.n_layers)] == g4.SWA_LAYERS
    assert [c.layer_head_dim(il) for il in range(c.n_layers)] == [64, 64, 128, 64, 64, 128]
    assert [c.kv_layer(il) for il in range(c.n_layers)] == [0, 1, 2, 1, 1, 2]  # llama.cpp's layer_reuse_cb
    assert (c.attn_scale, c.v_norm, c.n_embd_per_layer, c.rope_dim_swa) == (1.0, True, g4.N_EMBD_PER_LAYER, 64)
    assert (c.final_softcap, c.rope_base, c.rope_base_local) == (g4.FINAL_SOFTCAP, 1000000.0, 10000.0)
    assert not c.is_moe and not c.ffn_dense_and_experts
    assert [c.layer_n_kv_heads(il) for il in range(c.n_layers)] == [2, 2, 1, 2, 2, 1]  # per-layer arrays
    assert [c.layer_n_ff(il) for il in range(c.n_layers)] == [512, 512, 512, 1024, 1024, 1024]


def test_config_reads_gemma4_experts(gemma4_dir):
    c = ModelConfig.from_gguf(read_gguf(gemma4_dir / "gemma4-moe-F32.gguf"))
    assert (c.n_expert, c.n_expert_used, c.n_ff_exp) == (g4.N_EXPERT, g4.N_EXPERT_USED, g4.N_FF_EXP)
    assert (c.expert_gating, c.expert_norm_weights, c.ffn_dense_and_experts) == ("softmax", True, True)


def _without(field: str, value=None):
    def change(model):
        for layer in model.layers:
            setattr(layer, field, value)
    return change


@pytest.mark.parametrize(("variant", "block", "change"), [
    ("gemma4", "per-layer embeddings", lambda m: setattr(m, "per_layer", None)),
    ("gemma4", "layer output scale", _without("out_scale")),
    ("gemma4", "value norm", lambda m: object.__setattr__(m.config, "v_norm", False)),
    ("gemma4-moe", "per-expert output scale", _without("down_exps_scale")),
    ("gemma4-moe", "router input scale", _without("router_scale", np.float32(4.0))),
    ("gemma4-moe", "experts' output norm", _without("post_ffn_norm_2", np.float32(0.4))),
])
def test_each_gemma4_block_moves_the_logits(gemma4_dir, variant, block, change):
    """The F32 tolerance (0.05) is far below what leaving out any gemma4 block changes, so parity checks each."""
    path = gemma4_dir / f"{variant}-F32.gguf"
    ids = SEQUENCE[:40]

    def logits(model) -> np.ndarray:
        return model.forward(ids, model.new_cache(N_CTX), all_logits=True)

    full = logits(_backend("numpy", path))
    for name, change in {block: change}.items():
        model = _backend("numpy", path)
        change(model)
        assert np.abs(logits(model) - full).max() > 0.5, name


@pytest.mark.parametrize("backend", ["numpy", "mlx"])
def test_cache_snapshot_round_trip(gemma4_dir, backend):
    """Layers of different head widths export and import their caches; the import continues identically."""
    model = _backend(backend, gemma4_dir / "gemma4-F32.gguf")
    cache = model.new_cache(N_CTX)
    model.forward(SEQUENCE[:30], cache)
    state = cache.export_state()
    assert [k.shape[::2] for k in state.keys] == [(2, 64), (2, 64), (1, 128), (2, 64), (2, 64), (1, 128)]
    restored = model.new_cache(N_CTX)
    restored.import_state(state)
    np.testing.assert_array_equal(model.forward([5], restored), model.forward([5], cache))


@pytest.mark.parametrize(("change", "message"), [
    (dict(drop=("blk.1.inp_gate.weight",)), r"blk\.1\.inp_gate\.weight"),
    (dict(drop=("per_layer_model_proj.weight",)), r"per_layer_model_proj\.weight"),
    (dict(drop=("gemma4.embedding_length_per_layer_input",)), r"embedding_length_per_layer_input"),
    (dict(metadata={"gemma4.attention.value_length_swa": 32}), r"value_length_swa"),
    (dict(metadata={"gemma4.attention.shared_kv_layers": 2}), r"shared_kv_layers"),
    (dict(extra_tensors={"blk.0.ffn_gate_inp.weight": np.zeros((8, 256))}), r"blk\.0\.ffn_gate_inp\.weight"),
    (dict(extra_tensors={"blk.4.attn_q.weight": np.zeros((512, 256))}), r"blk\.4\.attn_q\.weight"),
    (dict(extra_tensors={"blk.0.attn_qkv.weight": np.zeros((768, 256))}), r"attn_qkv"),
    (dict(moe=True, drop=("blk.2.ffn_gate_inp.scale",)), r"blk\.2\.ffn_gate_inp\.scale"),
    (dict(moe=True, drop=("blk.1.pre_ffw_norm_2.weight",)), r"blk\.1\.pre_ffw_norm_2\.weight"),
    (dict(moe=True, drop=("blk.0.ffn_up.weight",)), r"blk\.0\.ffn_up\.weight"),
    (dict(moe=True, drop=("gemma4.expert_feed_forward_length",)), r"expert_feed_forward_length"),
    (dict(moe=True, drop=("blk.5.ffn_gate_inp.weight",)), r"blk\.5\.ffn_gate_inp\.weight"),  # a dense-only layer
    (dict(moe=True, extra_tensors={"blk.0.ffn_gate_up_exps.weight": np.zeros((8, 512, 256))}), r"ffn_gate_up_exps"),
    (dict(metadata={"gemma4.attention.head_count_kv": [2, 1, 1, 2, 2, 1]}), r"head_count_kv"),
    (dict(metadata={"gemma4.feed_forward_length": [512, 1024, 512, 1024, 1024, 1024]}), r"feed_forward_length"),
    (dict(extra_tensors={"blk.3.ffn_up.weight": np.zeros((512, 256))}), r"blk\.3\.ffn_up\.weight"),
])
def test_malformed_gemma4_is_refused_by_name(tmp_path, change, message):
    path = g4.write_gemma4(tmp_path / "bad.gguf", **change)
    with pytest.raises(ModelFormatError, match=message):
        gguf = read_gguf(path)
        NumpyBackend(gguf, ModelConfig.from_gguf(gguf), n_ctx=N_CTX)


def test_gemma4_chat_template_renders(tmp_path):
    path = g4.write_gemma4(tmp_path / "chat.gguf",
                           metadata={"tokenizer.chat_template": chat_template("google-gemma-4-31B-it")})
    model = engine.model.load(path, backend="numpy", n_ctx=256)
    try:
        prompt = model.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    finally:
        model.close()
    # without enable_thinking the template closes an empty thought channel itself
    assert prompt.endswith("<|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
                           "<|channel>thought\n<channel|>"), prompt


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_kv_cache_estimate_counts_each_layer_width(gemma4_dir, backend):
    """The memory estimate's KV bytes are what the cache allocates, layer widths and heads differing by kind (the
    CPU backend runs gemma4 on its reference path, with a float32 cache)."""
    from engine.memory_estimate import estimate_memory

    path = gemma4_dir / "gemma4-F32.gguf"
    model = _backend(backend, path)
    cache = model.new_cache(N_CTX)  # one growth step: N_CTX positions of every layer
    with read_gguf(path) as gguf:
        assert cache.nbytes == estimate_memory(gguf, N_CTX, backend).kv_cache_bytes
