"""Mixture-of-experts routing (engine/moe.py) on hand-made router logits, and the MoE FFN block's expert reads."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.backends.cpu_backend import CpuBackend
from engine.backends.numpy_backend import NumpyBackend
from engine.config import ModelConfig
from engine.gguf_file import ModelFormatError, read_gguf
from engine.moe import expert_groups, expert_probabilities, route
from tests.engine.synthetic.specs import N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_LAYERS, SPECS
from tests.engine.synthetic.writer import write_synthetic


def _config(**fields) -> ModelConfig:
    base = dict(arch="qwen3moe", n_layers=1, n_embd=8, n_ff=8, n_heads=1, n_kv_heads=1, head_dim=8, v_head_dim=8,
                n_vocab=4, n_ctx_train=64, rms_eps=1e-6, rope_base=1e4, rope_dim=8, rope_neox=True,
                n_expert=4, n_expert_used=2, n_ff_exp=8)
    return ModelConfig(**{**base, **fields})


LOGITS = np.array([[0.0, 2.0, 1.0, -1.0],
                   [3.0, 0.0, 0.0, 2.5]], dtype=np.float32)


def test_softmax_route_takes_the_top_k_and_renormalises():
    experts, weights = route(LOGITS, _config(expert_norm_weights=True))
    assert experts.tolist() == [[1, 2], [0, 3]]
    e = np.exp([2.0, 1.0])
    np.testing.assert_allclose(weights[0], e / e.sum(), rtol=1e-6)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-6)


def test_softmax_route_without_renormalisation_keeps_the_probabilities():
    experts, weights = route(LOGITS, _config(expert_norm_weights=False, expert_weights_scale=2.0))
    probs = expert_probabilities(LOGITS, "softmax")
    np.testing.assert_allclose(weights, 2.0 * np.take_along_axis(probs, experts, 1), rtol=1e-6)
    assert weights[0].sum() < 2.0


def test_sigmoid_gating_and_a_selection_bias_that_moves_the_choice_only():
    bias = np.array([0.0, 0.0, 0.0, 5.0], dtype=np.float32)
    experts, weights = route(LOGITS, _config(expert_gating="sigmoid"), selection_bias=bias)
    assert experts.tolist() == [[3, 1], [3, 0]]
    np.testing.assert_allclose(weights[0], 1.0 / (1.0 + np.exp(-np.array([-1.0, 2.0]))), rtol=1e-6)


def test_expert_groups_give_each_chosen_expert_its_rows_and_slots():
    experts = np.array([[1, 2], [2, 0], [1, 0]])
    groups = {e: (rows.tolist(), slots.tolist()) for e, rows, slots in expert_groups(experts)}
    assert groups == {0: ([1, 2], [1, 1]), 1: ([0, 2], [0, 0]), 2: ([0, 1], [1, 0])}


@pytest.fixture(scope="module")
def qwen3moe_path(tmp_path_factory):
    return write_synthetic(tmp_path_factory.mktemp("moe") / "qwen3moe.gguf", SPECS["qwen3moe"])


@pytest.fixture(scope="module")
def gpt_oss_path(tmp_path_factory):
    return write_synthetic(tmp_path_factory.mktemp("moe") / "gpt-oss.gguf", SPECS["gpt-oss"])


def test_config_reads_the_expert_metadata(qwen3moe_path):
    c = ModelConfig.from_gguf(read_gguf(qwen3moe_path))
    assert (c.n_expert, c.n_expert_used, c.n_ff_exp, c.expert_gating, c.expert_norm_weights) == \
        (N_EXPERT, N_EXPERT_USED, N_FF_EXP, "softmax", True)


def test_missing_expert_count_is_named(tmp_path):
    path = write_synthetic(tmp_path / "m.gguf", SPECS["qwen3moe"], drop=("qwen3moe.expert_count",))
    with pytest.raises(ModelFormatError, match=r"qwen3moe\.expert_count"):
        ModelConfig.from_gguf(read_gguf(path))


def test_a_dense_ffn_tensor_in_a_moe_model_is_refused(tmp_path):
    extra = {"blk.0.ffn_gate.weight": np.zeros((512, 256))}
    path = write_synthetic(tmp_path / "d.gguf", SPECS["qwen3moe"], extra_tensors=extra)
    gguf = read_gguf(path)
    with pytest.raises(ModelFormatError, match=r"blk\.0\.ffn_gate\.weight"):
        NumpyBackend(gguf, ModelConfig.from_gguf(gguf))


@pytest.mark.parametrize("name", ["qwen3moe", "gpt-oss"])
@pytest.mark.parametrize("backend", [NumpyBackend, CpuBackend])
def test_a_decode_step_reads_only_the_chosen_experts_rows(request, name, backend):
    gguf = read_gguf(request.getfixturevalue("qwen3moe_path" if name == "qwen3moe" else "gpt_oss_path"))
    model = backend(gguf, ModelConfig.from_gguf(gguf))
    cache = model.new_cache(64)
    model.forward([5, 9, 17, 30, 2], cache)
    read: list[tuple[int, int]] = []
    rows_of = model.matrix_rows
    model.matrix_rows = lambda matrix, rows: read.append((rows.start, rows.stop)) or rows_of(matrix, rows)
    model.forward([11], cache)
    # per layer: gate and up of each chosen expert (n_ff_exp rows), and its down (n_embd rows)
    assert len(read) == N_LAYERS * N_EXPERT_USED * 3
    experts = {start // N_FF_EXP for start, stop in read if stop - start == N_FF_EXP}
    assert len(experts) >= N_EXPERT_USED


def test_a_prefill_chunk_runs_each_chosen_expert_once_for_all_its_tokens(qwen3moe_path):
    gguf = read_gguf(qwen3moe_path)
    model = NumpyBackend(gguf, ModelConfig.from_gguf(gguf))
    products: list[int] = []
    matmul = model.matmul
    model.matmul = lambda x, w: products.append(x.shape[0]) or matmul(x, w)
    model.forward(list(range(40)), model.new_cache(64))
    # per layer: q, k, v, o, the router, then three products per expert used by some token; output: one
    per_layer_experts = (len(products) - 1 - N_LAYERS * 5) / (3 * N_LAYERS)
    assert N_EXPERT_USED < per_layer_experts <= N_EXPERT  # tokens spread over experts, each expert run once
    assert sum(products[5:5 + 3 * int(per_layer_experts)]) == 3 * 40 * N_EXPERT_USED  # every routed row once


def _mlx_backend(gguf, config):
    from engine.backends.mlx_backend import MlxBackend

    return MlxBackend(gguf, config)


@pytest.mark.parametrize("name", ["qwen3moe", "gpt-oss"])
@pytest.mark.parametrize("backend", [CpuBackend, _mlx_backend], ids=["cpu", "mlx"])
def test_batched_moe_decode_matches_each_sequence_alone(request, name, backend):
    gguf = read_gguf(request.getfixturevalue("qwen3moe_path" if name == "qwen3moe" else "gpt_oss_path"))
    model = backend(gguf, ModelConfig.from_gguf(gguf))
    prompts = ([3, 4, 5, 6], [40, 41])
    caches, alone = [], []
    for prompt in prompts:
        cache = model.new_cache(64)
        model.forward(prompt, cache)
        caches.append(cache)
        single = model.new_cache(64)
        model.forward(prompt, single)
        alone.append(model.forward([7], single))
    np.testing.assert_allclose(model.forward_batch([7, 7], caches), np.stack(alone), atol=2e-3, rtol=1e-4)


def test_memory_estimate_counts_every_expert_resident_and_the_chosen_ones_read(qwen3moe_path, tmp_path):
    from engine.memory_estimate import estimate_memory

    gguf = read_gguf(qwen3moe_path)
    estimate = estimate_memory(gguf, 256, "cpu")
    stored = sum(t.nbytes for t in gguf.tensors.values())
    experts = sum(t.nbytes for name, t in gguf.tensors.items() if "_exps." in name)
    assert estimate.weights_bytes == stored  # all experts resident (memory-mapped)
    model = CpuBackend(gguf, ModelConfig.from_gguf(gguf))
    cache = model.new_cache(256)
    cache.reserve(256)
    assert estimate.kv_cache_bytes == cache.nbytes  # the float32 cache of the reference path
    assert estimate.active_weights_bytes == round(stored - experts * (1 - N_EXPERT_USED / N_EXPERT))
    dense = read_gguf(write_synthetic(tmp_path / "dense.gguf", SPECS["qwen3"]))
    dense_estimate = estimate_memory(dense, 256, "cpu")
    assert dense_estimate.active_weights_bytes == dense_estimate.weights_bytes


def test_inspect_shows_the_bytes_read_per_token(qwen3moe_path, capsys):
    from engine.cli import main

    main(["inspect", str(qwen3moe_path), "--backend", "cpu"])
    out = capsys.readouterr().out
    assert "all experts resident (memory-mapped), weights read per token" in out


def test_inspect_says_a_file_larger_than_free_memory_runs_from_the_page_cache(qwen3moe_path, capsys, monkeypatch):
    import json

    import engine.memory_estimate
    from engine.cli import main

    e = engine.memory_estimate.estimate_memory(read_gguf(qwen3moe_path), 4096, "cpu")  # inspect's default n_ctx
    free = e.total_bytes - e.weights_bytes // 2  # all but half the weights fit
    monkeypatch.setattr(engine.memory_estimate, "system_memory",
                        lambda: engine.memory_estimate.SystemMemory(4 * free, free, False))
    main(["inspect", str(qwen3moe_path), "--backend", "cpu"])
    assert "memory: the memory-mapped weights" in capsys.readouterr().out
    main(["inspect", str(qwen3moe_path), "--backend", "cpu", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["fit"] == "paged" and data["memory_estimate"]["mapped_bytes"] == data["memory_estimate"]["weights_bytes"]


@pytest.mark.parametrize("backend", [NumpyBackend, CpuBackend, _mlx_backend], ids=["numpy", "cpu", "mlx"])
def test_backends_report_the_weight_bytes_one_token_reads(qwen3moe_path, backend):
    from engine.memory_estimate import active_weight_fraction

    gguf = read_gguf(qwen3moe_path)
    config = ModelConfig.from_gguf(gguf)
    stats = backend(gguf, config).memory()
    assert stats.active_weights_bytes == round(stats.weights_bytes * active_weight_fraction(gguf, config))
    assert stats.active_weights_bytes < 0.5 * stats.weights_bytes  # 2 of 8 experts


# -- the MoE block's options, on a hand-made layer --------------------------------------------------------------
def test_softmax_weight_gating_chooses_on_the_logits_and_softmaxes_the_chosen():
    experts, weights = route(LOGITS, _config(expert_gating="softmax_weight"))
    assert experts.tolist() == [[1, 2], [0, 3]]
    e = np.exp([3.0, 2.5])
    np.testing.assert_allclose(weights[1], e / e.sum(), rtol=1e-6)


def test_swiglu_oai_clamps_the_gate_above_and_up_on_both_sides():
    from engine.moe import swiglu_oai

    gate = np.array([1.0, 10.0, -10.0, 2.0], dtype=np.float32)
    up = np.array([0.5, 0.5, 0.5, -9.0], dtype=np.float32)
    x = np.array([1.0, 7.0, -10.0, 2.0])
    y = np.array([0.5, 0.5, 0.5, -7.0])
    expected = x / (1.0 + np.exp(-1.702 * x)) * (y + 1.0)
    np.testing.assert_allclose(swiglu_oai(gate, up), expected, rtol=1e-5)


N_EMBD_T, N_FF_T, N_EXP_T = 8, 4, 4


def _hand_layer(rng, shared: bool):
    """A numpy_backend.Layer-like namespace with every optional MoE tensor, float32 (matrices (rows, cols))."""
    import types

    def m(rows, cols):
        return rng.standard_normal((rows, cols)).astype(np.float32)

    def v(n):
        return rng.standard_normal(n).astype(np.float32)

    return types.SimpleNamespace(
        w_router=m(N_EXP_T, N_EMBD_T), b_router=v(N_EXP_T), exp_probs_b=0.5 * v(N_EXP_T),
        w_gate_exps=m(N_EXP_T * N_FF_T, N_EMBD_T), w_up_exps=m(N_EXP_T * N_FF_T, N_EMBD_T),
        w_down_exps=m(N_EXP_T * N_EMBD_T, N_FF_T), b_gate_exps=v(N_EXP_T * N_FF_T), b_up_exps=v(N_EXP_T * N_FF_T),
        b_down_exps=v(N_EXP_T * N_EMBD_T),
        w_gate_shexp=m(6, N_EMBD_T) if shared else None, w_up_shexp=m(6, N_EMBD_T) if shared else None,
        w_down_shexp=m(N_EMBD_T, 6) if shared else None, w_gate_inp_shexp=v(N_EMBD_T) if shared else None)


def _block_config(**fields):
    return _config(n_embd=N_EMBD_T, n_expert=N_EXP_T, n_expert_used=2, n_ff_exp=N_FF_T, **fields)


def _one_token_at_a_time(h, layer, config, gated):
    """The block written out per token and per chosen expert, as llama.cpp's build_moe_ffn reads."""
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        logits = layer.w_router @ h[t] + layer.b_router
        probs = expert_probabilities(logits[None], config.expert_gating)[0]
        chosen = np.argsort(-(probs + layer.exp_probs_b), kind="stable")[:2]
        w = probs[chosen]
        if config.expert_gating == "softmax_weight":
            w = np.exp(w - w.max()) / np.exp(w - w.max()).sum()
        if config.expert_norm_weights:
            w = w / w.sum()
        for e, weight in zip(chosen, w):
            x = h[t] * weight if config.expert_weights_before else h[t]
            ff, dn = slice(e * N_FF_T, (e + 1) * N_FF_T), slice(e * N_EMBD_T, (e + 1) * N_EMBD_T)
            act = gated(layer.w_gate_exps[ff] @ x + layer.b_gate_exps[ff], layer.w_up_exps[ff] @ x + layer.b_up_exps[ff])
            y = layer.w_down_exps[dn] @ act + layer.b_down_exps[dn]
            out[t] += y if config.expert_weights_before else weight * y
        if layer.w_gate_shexp is not None:
            shared = layer.w_down_shexp @ gated(layer.w_gate_shexp @ h[t], layer.w_up_shexp @ h[t])
            out[t] += shared / (1.0 + np.exp(-(layer.w_gate_inp_shexp @ h[t])))
    return out


BLOCK_OPTIONS = [
    dict(expert_gating="softmax", expert_norm_weights=True),
    dict(expert_gating="sigmoid", expert_weights_before=True),
    dict(expert_gating="softmax_weight"),
]


@pytest.mark.parametrize("shared", [False, True], ids=["routed", "with-shared-expert"])
@pytest.mark.parametrize("options", BLOCK_OPTIONS, ids=["softmax-norm", "sigmoid-weights-before", "softmax-weight"])
def test_numpy_moe_block_matches_the_block_written_out(options, shared):
    from engine.backends.numpy_backend import GATED_ACTIVATIONS
    from engine.moe import moe_ffn

    rng = np.random.default_rng(5)
    layer, config = _hand_layer(rng, shared), _block_config(**options)
    h = rng.standard_normal((9, N_EMBD_T)).astype(np.float32)
    gated = GATED_ACTIVATIONS["swiglu_oai"]
    ours = moe_ffn(h, layer, config, lambda x, w: x @ w.T, lambda w, rows: w[rows], gated)
    np.testing.assert_allclose(ours, _one_token_at_a_time(h, layer, config, gated), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("shared", [False, True], ids=["routed", "with-shared-expert"])
@pytest.mark.parametrize("options", BLOCK_OPTIONS, ids=["softmax-norm", "sigmoid-weights-before", "softmax-weight"])
def test_mlx_moe_block_matches_the_numpy_block(options, shared):
    import types

    import mlx.core as mx
    from engine.backends.mlx.moe import moe_ffn as mlx_moe_ffn, swiglu_oai_gated
    from engine.backends.mlx.weights import DenseMatrix
    from engine.backends.mlx_backend import row_range
    from engine.backends.numpy_backend import GATED_ACTIVATIONS
    from engine.moe import moe_ffn

    rng = np.random.default_rng(6)
    layer, config = _hand_layer(rng, shared), _block_config(**options)
    h = rng.standard_normal((9, N_EMBD_T)).astype(np.float32)
    expected = moe_ffn(h, layer, config, lambda x, w: x @ w.T, lambda w, rows: w[rows],
                       GATED_ACTIVATIONS["swiglu_oai"])
    as_mlx = types.SimpleNamespace(**{
        name: None if value is None else DenseMatrix(mx.array(value)) if value.ndim == 2 else mx.array(value)
        for name, value in vars(layer).items()})
    ours = mlx_moe_ffn(mx.array(h)[None], as_mlx, config, swiglu_oai_gated, row_range, mx.float32)
    assert ours.shape == (1, 9, N_EMBD_T)
    np.testing.assert_allclose(np.array(ours[0]), expected, rtol=2e-5, atol=2e-5)


def test_a_gpt_oss_expert_bias_tensor_is_required(tmp_path):
    path = write_synthetic(tmp_path / "g.gguf", SPECS["gpt-oss"], drop=("blk.1.ffn_up_exps.bias",))
    gguf = read_gguf(path)
    with pytest.raises(ModelFormatError, match=r"blk\.1\.ffn_up_exps\.bias"):
        NumpyBackend(gguf, ModelConfig.from_gguf(gguf))


def test_a_shared_expert_in_a_model_without_one_is_refused(tmp_path):
    extra = {"blk.0.ffn_gate_shexp.weight": np.zeros((256, 256))}
    path = write_synthetic(tmp_path / "s.gguf", SPECS["qwen3moe"], extra_tensors=extra)
    gguf = read_gguf(path)
    with pytest.raises(ModelFormatError, match=r"blk\.0\.ffn_gate_shexp\.weight"):
        NumpyBackend(gguf, ModelConfig.from_gguf(gguf))


def test_an_mlx_decode_step_takes_only_the_chosen_experts_rows(gpt_oss_path, monkeypatch):
    import engine.backends.mlx_backend as mlx_backend

    gguf = read_gguf(gpt_oss_path)
    model = mlx_backend.MlxBackend(gguf, ModelConfig.from_gguf(gguf))
    cache = model.new_cache(64)
    model.forward([5, 9, 17, 30, 2], cache)
    taken: list[tuple[int, int]] = []
    rows_of = mlx_backend.row_range
    monkeypatch.setattr(mlx_backend, "row_range", lambda m, ref: taken.append((ref.row_start, ref.row_stop)) or rows_of(m, ref))
    model.forward([11], cache)
    assert len(taken) == N_LAYERS * N_EXPERT_USED * 3  # gate, up and down of each chosen expert, per layer
    assert all(stop - start == N_FF_EXP and start % N_FF_EXP == 0 for start, stop in taken)  # one expert's rows
    per_layer = [taken[i:i + 3 * N_EXPERT_USED] for i in range(0, len(taken), 3 * N_EXPERT_USED)]
    assert all(len({start for start, _ in layer}) == N_EXPERT_USED for layer in per_layer)
