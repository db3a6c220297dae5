"""ModelConfig.from_gguf per architecture, and the RoPE tables of engine/rope.py, against llama.cpp's rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.config import ModelConfig
from engine.gguf_file import ModelFormatError, read_gguf
from engine.model_tensors import TensorRef, layer_tensor_names
from engine.rope import attn_temperature, rope_tables, yarn_corr_dims, yarn_mscale
from tests.engine.synthetic.specs import HEAD_DIM, N_FF, N_KV_HEADS, N_LAYERS, SPECS
from tests.engine.synthetic.writer import write_synthetic


def load(tmp_path, name: str, metadata=None, **kwargs):
    path = write_synthetic(tmp_path / f"{name}.gguf", SPECS[name], metadata=metadata, **kwargs)
    gguf = read_gguf(path)
    return gguf, ModelConfig.from_gguf(gguf)


def test_architecture_switches(tmp_path):
    _, gemma2 = load(tmp_path, "gemma2")
    assert (gemma2.attn_softcap, gemma2.final_softcap, gemma2.activation) == (5.0, 8.0, "gelu_tanh")
    assert [gemma2.is_sliding(i) for i in range(4)] == [True, False, True, False]  # llama.cpp set_swa_pattern(2)
    assert gemma2.embed_scale == 16.0 and gemma2.rope_neox and gemma2.post_norms
    _, olmo2 = load(tmp_path, "olmo2")
    assert not olmo2.pre_norms and olmo2.qk_norm_whole and olmo2.post_norms and not olmo2.qk_norm
    _, granite = load(tmp_path, "granite")
    assert (granite.residual_scale, granite.logit_scale, granite.embed_scale) == (0.5, 2.0, 2.0)
    assert granite.attn_scale == pytest.approx(0.03) and not granite.rope_neox
    _, smollm3 = load(tmp_path, "smollm3")
    assert [smollm3.is_rope_layer(i) for i in range(8)] == [True, True, True, False] * 2
    _, qwen3 = load(tmp_path, "qwen3")
    assert qwen3.qk_norm and qwen3.rope_neox and qwen3.tied_embeddings


def test_phi3_sliding_window_metadata_is_ignored_as_llama_cpp_does(tmp_path):
    _, phi3 = load(tmp_path, "phi3")
    assert phi3.sliding_window == 0 and not any(phi3.is_sliding(i) for i in range(N_LAYERS))
    assert phi3.rope_dim == HEAD_DIM // 2 and phi3.rope_factors


@pytest.mark.parametrize(("n_layers", "scale"), [(4, 1 / math.sqrt(32)), (46, 1 / math.sqrt(256 / 4))])
def test_gemma2_27b_attention_scale_rule(tmp_path, n_layers, scale):
    # llama.cpp: 1/sqrt(n_embd / n_head) for the 27B type (46 layers), else 1/sqrt(head_dim)
    head = {"gemma2.attention.key_length": 32, "gemma2.attention.value_length": 32,
            "gemma2.rope.dimension_count": 32, "gemma2.block_count": n_layers}
    _, c = load(tmp_path, "gemma2", metadata=head)
    assert c.attn_scale == pytest.approx(scale)


def test_fused_tensors_are_row_ranges(tmp_path):
    gguf, phi3 = load(tmp_path, "phi3")
    refs = layer_tensor_names(gguf, phi3, 1)
    n_q, n_kv = phi3.n_q_embd, phi3.n_kv_embd
    assert refs["wq"] == TensorRef("blk.1.attn_qkv.weight", 0, n_q)
    assert refs["wk"] == TensorRef("blk.1.attn_qkv.weight", n_q, n_q + n_kv)
    assert refs["wv"] == TensorRef("blk.1.attn_qkv.weight", n_q + n_kv, n_q + 2 * n_kv)
    assert refs["w_gate"] == TensorRef("blk.1.ffn_up.weight", 0, N_FF)  # ggml swiglu: the gate is the first half
    assert refs["w_up"] == TensorRef("blk.1.ffn_up.weight", N_FF, 2 * N_FF)
    gguf, llama = load(tmp_path, "llama")
    assert layer_tensor_names(gguf, llama, 0)["wq"] == TensorRef("blk.0.attn_q.weight")


def test_yarn_corr_dims_follow_ggml():
    def corr_dim(n_rot):  # ggml_rope_yarn_corr_dim
        return 64 * math.log(32 / (n_rot * 2 * math.pi)) / (2 * math.log(10000.0))
    low, high = yarn_corr_dims(64, 32, 10000.0, 32.0, 1.0)
    assert (low, high) == (max(0, math.floor(corr_dim(32.0))), min(63, math.ceil(corr_dim(1.0))))
    assert (low, high) == (0.0, 6.0)


def test_yarn_tables_and_mscale(tmp_path):
    gguf, c = load(tmp_path, "llama-yarn")
    inv_freq, layer_set = rope_tables(gguf, c)
    assert layer_set == [0] * N_LAYERS and inv_freq.shape == (1, HEAD_DIM // 2)
    plain = 10000.0 ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    ratio = inv_freq[0] / plain  # 1 (extrapolated) at dim 0, ramping to 1/4 (interpolated) from dim 6 on
    low, high = yarn_corr_dims(HEAD_DIM, 32, 10000.0, 32.0, 1.0)
    ramp = 1 - np.clip((np.arange(HEAD_DIM // 2) - low) / (high - low), 0, 1)
    np.testing.assert_allclose(ratio, 0.25 * (1 - ramp) + ramp, rtol=1e-12)
    assert ratio[0] == pytest.approx(1.0) and ratio[-1] == pytest.approx(0.25)
    assert c.rope_mscale == pytest.approx(1 + 0.1 * math.log(4.0), rel=1e-6)  # attn_factor cancels, ggml multiplies


def test_yarn_log_multiplier_mscale(tmp_path):
    _, c = load(tmp_path, "mistral3")
    expected = (1 + 0.1 * math.log(4.0)) / (1 + 0.1 * 0.2 * math.log(4.0))  # get_mscale(f, 1) / get_mscale(f, 0.2)
    assert yarn_mscale(c) == pytest.approx(expected, rel=1e-6) and c.rope_mscale == pytest.approx(expected, rel=1e-6)


def test_temperature_tuning_formula(tmp_path):
    _, c = load(tmp_path, "mistral3")
    assert (c.attn_temp_scale, c.attn_temp_floor) == (0.5, 16)  # the floor is rope.scaling.original_context_length
    got = attn_temperature(c, np.array([0, 15, 16, 47, 48]))
    np.testing.assert_allclose(got, [1.0, 1.0, 1 + 0.5 * math.log(2), 1 + 0.5 * math.log(3), 1 + 0.5 * math.log(4)],
                               rtol=1e-6)


def test_no_rope_layers_have_set_minus_one(tmp_path):
    gguf, c = load(tmp_path, "smollm3")
    assert rope_tables(gguf, c)[1] == [0, 0, 0, -1]
    gguf, c = load(tmp_path, "granite", metadata={"granite.rope.scaling.finetuned": False})
    assert rope_tables(gguf, c)[1] == [-1] * N_LAYERS


def test_gemma3_sliding_layers_are_not_scaled(tmp_path):
    gguf, c = load(tmp_path, "gemma3-linear")
    inv_freq, layer_set = rope_tables(gguf, c)
    assert layer_set == [0 if not c.is_sliding(i) else 1 for i in range(N_LAYERS)] and inv_freq.shape[0] == 2
    dims = np.arange(0, HEAD_DIM, 2) / HEAD_DIM
    np.testing.assert_allclose(inv_freq[0], 1e6 ** -dims / 8.0)  # global layers: linear factor 8
    np.testing.assert_allclose(inv_freq[1], 1e4 ** -dims)  # sliding layers: base 10000, unscaled (llama.cpp)


def test_llama3_rope_freqs_divide_the_frequencies(tmp_path):
    gguf, c = load(tmp_path, "llama3-rope-freqs")
    factors = gguf.raw("rope_freqs.weight").view(np.float32).reshape(-1)
    inv_freq, _ = rope_tables(gguf, c)
    np.testing.assert_allclose(inv_freq[0], 1e4 ** -(np.arange(0, HEAD_DIM, 2) / HEAD_DIM) / factors, rtol=1e-12)
    assert factors.max() == 8.0


@pytest.mark.parametrize(("n_ctx", "factors"), [(None, "short"), (256, "short"), (512, "short"), (513, "long")])
def test_longrope_factors_chosen_by_padded_context(tmp_path, n_ctx, factors):
    # llama.cpp: long when n_ctx rounded up to a multiple of 256 exceeds original_context_length (here 512)
    gguf, c = load(tmp_path, "phi3", metadata={"phi3.rope.scaling.original_context_length": 512})
    tensor = gguf.raw(f"rope_factors_{factors}.weight").view(np.float32).reshape(-1)
    inv_freq, _ = rope_tables(gguf, c, n_ctx)
    np.testing.assert_allclose(inv_freq[0], 1e4 ** -(np.arange(0, c.rope_dim, 2) / c.rope_dim) / tensor, rtol=1e-12)
    assert c.rope_mscale == pytest.approx(c.rope_attn_factor, rel=1e-6)  # no YaRN: mscale is the attn_factor


def test_swa_pattern_array(tmp_path):
    pattern = ([True, True, False, True], __import__("gguf").GGUFValueType.BOOL)
    _, c = load(tmp_path, "gemma2", metadata={"gemma2.attention.sliding_window_pattern": pattern})
    assert [c.is_sliding(i) for i in range(N_LAYERS)] == [True, True, False, True]


@pytest.mark.parametrize(("name", "metadata", "message"), [
    ("llama", {"llama.rope.scaling.type": "xdrope"}, "rope.scaling.type"),
    ("llama", {"llama.rope.dimension_count": 32}, "rope.dimension_count"),
    ("granite", {"granite.logit_scale": 0.0}, "logit_scale"),
    ("olmo2", {"olmo2.attention.sliding_window": 16, "olmo2.rope.scaling.type": "yarn",
               "olmo2.rope.scaling.factor": 2.0}, "sliding-window layers and YaRN"),
    ("gemma2", {"gemma2.attention.sliding_window_pattern": ([True, False, False, True],
                                                            __import__("gguf").GGUFValueType.BOOL)},
     "sliding_window_pattern"),
])
def test_bad_metadata_is_refused(tmp_path, name, metadata, message):
    with pytest.raises(ModelFormatError, match=message):
        load(tmp_path, name, metadata=metadata)


def test_longrope_factors_without_longrope_metadata_are_refused(tmp_path):
    extra = {"rope_factors_long.weight": np.ones(HEAD_DIM // 2), "rope_factors_short.weight": np.ones(HEAD_DIM // 2)}
    gguf, c = load(tmp_path, "llama", extra_tensors=extra)
    with pytest.raises(ModelFormatError, match="rope_factors_long"):
        layer_tensor_names(gguf, c, 0)


def test_kv_heads_shape_of_whole_projection_norms(tmp_path):
    gguf, c = load(tmp_path, "olmo2", extra_tensors={"blk.0.attn_k_norm.weight": np.ones(HEAD_DIM)})
    with pytest.raises(ModelFormatError, match=r"attn_k_norm.*\(%d,\)" % (N_KV_HEADS * HEAD_DIM)):
        layer_tensor_names(gguf, c, 0)
