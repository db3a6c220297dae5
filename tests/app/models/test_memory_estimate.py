"""Memory estimate: KV arithmetic on tiny models, fit thresholds, and the 15 % bar against measured RSS."""

from __future__ import annotations

import pytest

from engine.gguf_file import read_gguf
from engine.memory_estimate import estimate_memory, fit_verdict, scratch_bytes, system_memory
from engine.config import ModelConfig
from tests.app.models.measure_memory import measure
from tests.app.models.tiny_gguf import write_tiny_gguf
from tests.model_store import model_path


def test_kv_cache_counts_keys_and_values_of_every_layer(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", n_layers=3, n_embd=32)  # 2 kv heads of head_dim 8
    with read_gguf(path) as g:
        est = estimate_memory(g, n_ctx=100, kv_bytes_per_element=2)
        assert est.kv_cache_bytes == 2 * 3 * 100 * 2 * 8 * 2
        assert est.weights_bytes == sum(t.nbytes for t in g.tensors.values())
        assert est.total_bytes == est.weights_bytes + est.kv_cache_bytes + est.overhead_bytes
        assert est.overhead_bytes >= scratch_bytes(ModelConfig.from_gguf(g), 100) + g.data_offset


def test_sliding_window_layers_hold_only_the_window(tmp_path):
    path = write_tiny_gguf(tmp_path / "g.gguf", arch="gemma3", n_layers=12, sliding_window=16)
    with read_gguf(path) as g:
        per_position = 2 * 2 * 8 * 4  # keys and values, 2 kv heads, head_dim 8, float32
        # swa_pattern 6: layers 5 and 11 are global, the other ten see 16 positions at most
        assert estimate_memory(g, n_ctx=1000).kv_cache_bytes == (2 * 1000 + 10 * 16) * per_position
        assert estimate_memory(g, n_ctx=10).kv_cache_bytes == 12 * 10 * per_position


def test_bad_arguments_are_refused(tmp_path):
    with read_gguf(write_tiny_gguf(tmp_path / "t.gguf")) as g:
        with pytest.raises(ValueError, match="n_ctx"):
            estimate_memory(g, n_ctx=0)
        with pytest.raises(ValueError, match="not modelled"):
            estimate_memory(g, n_ctx=8, backend="mlx")


@pytest.mark.parametrize("total, verdict", [(750, "fits"), (751, "tight"), (1000, "tight"), (1001, "won't fit")])
def test_fit_verdict_thresholds(total, verdict):
    assert fit_verdict(total, 1000) == verdict


def test_system_memory_reports_this_machine():
    mem = system_memory()
    assert 0 < mem.available_bytes <= mem.total_bytes


@pytest.mark.slow
@pytest.mark.parametrize("name, n_ctx", [("smollm2", 4096), ("gemma3", 32768), ("qwen25coder", 512)])
def test_estimate_within_15_percent_of_measured_rss_growth(name, n_ctx):
    result = measure(model_path(name), n_ctx)
    assert abs(result["total"] - result["measured"]) <= 0.15 * result["measured"], result
