"""Memory estimate: KV arithmetic on tiny models, fit thresholds, and the 8 % bar against measured RSS."""

from __future__ import annotations

import pytest

from engine.gguf_file import read_gguf
import engine.model
from engine.memory_estimate import (KV_LAYOUTS, RUNTIME_BASELINE_BYTES, cpu_decoder_scratch_bytes, estimate_memory,
                                    fit_verdict, kv_cache_bytes, metadata_bytes, scratch_bytes, system_memory)
from engine.config import ModelConfig
from tests.app.models.measure_memory import measure
from tests.app.models.tiny_gguf import write_tiny_gguf
from tests.model_store import model_path


def test_kv_cache_counts_keys_and_values_of_every_layer(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", n_layers=3, n_embd=32)  # 2 kv heads of head_dim 8
    with read_gguf(path) as g:
        est = estimate_memory(g, n_ctx=100)  # the CPU backend's float16
        assert est.kv_cache_bytes == 2 * 3 * 100 * 2 * 8 * 2
        assert est.weights_bytes == sum(t.nbytes for t in g.tensors.values())
        assert est.total_bytes == est.weights_bytes + est.kv_cache_bytes + est.overhead_bytes
        assert est.overhead_bytes == (scratch_bytes(ModelConfig.from_gguf(g), 100) + metadata_bytes(g)
                                      + RUNTIME_BASELINE_BYTES)
        assert metadata_bytes(g) > 0


def test_sliding_window_layers_hold_only_the_window_where_the_backend_keeps_rings(tmp_path):
    path = write_tiny_gguf(tmp_path / "g.gguf", arch="gemma3", n_layers=12, sliding_window=16)
    with read_gguf(path) as g:
        config, per_position = ModelConfig.from_gguf(g), 2 * 2 * 8  # keys and values, 2 kv heads, head_dim 8
        # swa_pattern 6: layers 5 and 11 are global, the other ten see 16 positions at most
        assert kv_cache_bytes(config, 1000, 4, sliding_rings=True) == (2 * 1000 + 10 * 16) * per_position * 4
        assert kv_cache_bytes(config, 10, 4, sliding_rings=True) == 12 * 10 * per_position * 4
        # the CPU and NumPy backends give every layer the whole context
        assert estimate_memory(g, n_ctx=1000).kv_cache_bytes == 12 * 1000 * per_position * 2
        assert estimate_memory(g, n_ctx=1000, backend="numpy").kv_cache_bytes == 12 * 1000 * per_position * 4


@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(KV_LAYOUTS))
def test_kv_layouts_are_what_the_backends_allocate(backend):
    """On Gemma 3, whose sliding-window layers a ring would shrink: the table is the backend's real cache."""
    model = engine.model.load(model_path("gemma3"), backend=backend, n_ctx=2048)
    try:
        cache = model.backend.new_cache(2048)
        cache.reserve(2048)
        layout = KV_LAYOUTS[backend]
        assert model.backend.kv_sliding_rings == layout.sliding_rings
        assert cache.nbytes == kv_cache_bytes(model.config, 2048, layout.element_bytes, layout.sliding_rings)
        assert model.kv_cache_usage.max_bytes == cache.nbytes
    finally:
        model.close()


def test_bad_arguments_are_refused(tmp_path):
    with read_gguf(write_tiny_gguf(tmp_path / "t.gguf")) as g:
        with pytest.raises(ValueError, match="n_ctx"):
            estimate_memory(g, n_ctx=0)
        with pytest.raises(ValueError, match="not modelled"):
            estimate_memory(g, n_ctx=8, backend="vulkan")


@pytest.mark.parametrize("total, verdict", [(750, "fits"), (751, "tight"), (1000, "tight"), (1001, "won't fit")])
def test_fit_verdict_thresholds(total, verdict):
    assert fit_verdict(total, 1000) == verdict


def test_system_memory_reports_this_machine():
    mem = system_memory()
    assert 0 < mem.available_bytes <= mem.total_bytes


ESTIMATE_BOUND = 0.08  # the README's figure: the estimate is within 8 % of what a real load holds
REAL_LOADS = [("smollm2", 4096), ("gemma3", 32768), ("qwen25coder", 512)]


@pytest.mark.slow
@pytest.mark.parametrize("name, n_ctx", REAL_LOADS)
def test_estimate_within_8_percent_of_a_real_cpu_load_at_full_context(name, n_ctx):
    result = measure(model_path(name), n_ctx, "cpu")
    assert abs(result["total"] - result["measured"]) <= ESTIMATE_BOUND * result["measured"], result


@pytest.mark.slow
@pytest.mark.parametrize("name, n_ctx", [("smollm2", 4096), ("gemma3", 8192), ("qwen25coder", 512)])
def test_estimate_within_8_percent_of_the_numpy_fallbacks_peak_at_full_context(name, n_ctx):
    """The NumPy backend (what runs when the C kernels are unavailable) holds float32 weights and, at its peak,
    every head's attention scores of a prompt chunk over the whole context: the estimate counts both."""
    result = measure(model_path(name), n_ctx, "numpy")
    assert abs(result["total"] - result["peak"]) <= ESTIMATE_BOUND * result["peak"], result


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_the_cpu_scratch_figure_is_the_c_decoders_arena_after_a_full_chunk(name):
    model = engine.model.load(model_path(name), backend="cpu", n_ctx=1024)
    try:
        from engine.backends.cpu.decoder import MAX_ROWS

        cache = model.backend.new_cache(1024)
        model.backend.forward([model.tokenize("The")[-1]] * MAX_ROWS, cache)
        arena = model.backend.decoder.scratch_bytes
        logits = model.config.n_vocab * 4
        assert abs(cpu_decoder_scratch_bytes(model.config) - logits - arena) <= 0.05 * arena
    finally:
        model.close()
