"""The MLX compute-dtype policy on the real test models: what it picks on a (faked) Mac GPU and on MLX's CPU device,
that the backend computes in it, and that ``inspect`` says so with the reason."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.backends import platform_mlx
from engine.backends.mlx_compute import FLOAT16_MAX, ComputeDtype, choose_compute_dtype, choose_for_file, post_norm_bound
from engine.cli import main
from engine.config import ModelConfig
from engine.gguf_file import GGUFHeader, read_gguf
from tests.model_store import model_path

# What the policy picks on a Mac GPU, per real model (measurements in engine/backends/mlx_compute.py).
GPU_DTYPES = {"smollm2": "float16", "gemma3": "float16", "qwen25coder": "float16"}


# Gemma 3 270M's largest post-norm weight magnitude is 1,657.0 (layer 16's post_ffw_norm): sqrt(640) * that.
GEMMA3_BOUND = 41_919


def choices(name: str) -> tuple:
    """The policy's choice for model ``name`` on a GPU and on the CPU device, and its post-norm bound."""
    with read_gguf(model_path(name)) as gguf:
        config = ModelConfig.from_gguf(gguf)
        return choose_for_file(gguf, config, True), choose_for_file(gguf, config, False), post_norm_bound(gguf, config)


@pytest.mark.parametrize("name", sorted(GPU_DTYPES))
def test_the_policy_picks_each_models_dtype_on_a_gpu_and_float32_on_the_cpu_device(name):
    gpu, cpu, bound = choices(name)
    assert gpu.name == GPU_DTYPES[name] and cpu.name == "float32"
    if name == "gemma3":  # post-norms: float16 because their outputs are bounded below its range
        assert round(bound) == GEMMA3_BOUND and f"within {GEMMA3_BOUND:,}" in gpu.reason
    else:
        assert bound is None and gpu.reason == "the GPU's fast path; the residual stream stays float32"


def test_the_post_norm_bound_is_read_from_the_file_as_gguf_py_reads_it():
    import gguf as gguf_py

    reader = gguf_py.GGUFReader(model_path("gemma3"))
    weights = [t.data for t in reader.tensors if t.name.endswith(("post_attention_norm.weight", "post_ffw_norm.weight"))]
    assert len(weights) == 2 * 18
    expected = np.sqrt(640) * max(float(np.abs(w).max()) for w in weights)
    assert choices("gemma3")[2] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("bound, dtype", [(None, "float16"), (FLOAT16_MAX * 0.99, "float16"),
                                          (FLOAT16_MAX * 1.01, "float32"), (1e9, "float32")])
def test_a_post_norm_bound_beyond_float16s_range_makes_the_gpu_compute_in_float32(bound, dtype):
    with read_gguf(model_path("gemma3")) as gguf:
        config = ModelConfig.from_gguf(gguf)
    gpu = choose_compute_dtype(config, on_gpu=True, post_norm_bound=bound)
    assert gpu.name == dtype
    if dtype == "float32":
        assert gpu.reason == f"post-normed block outputs can reach {bound:,.0f}, beyond float16's 65,504"
    assert choose_compute_dtype(config, on_gpu=False, post_norm_bound=bound).name == "float32"


def header_of(path) -> GGUFHeader:
    """The file's header alone, as the Models page reads a Hub file before downloading it."""
    with open(path, "rb") as f:
        return GGUFHeader(f.read(16 << 20), path.stat().st_size, path.name)


@pytest.mark.mlx
@pytest.mark.parametrize("on_gpu, bound_past_float16, element", [(True, False, 2), (True, True, 4), (False, False, 4)])
def test_the_mlx_memory_estimate_keeps_the_kv_cache_in_the_models_own_compute_dtype(on_gpu, bound_past_float16,
                                                                                    element, monkeypatch):
    """Gemma 3 on a (faked) GPU computes in float16 by its real post-norm bound, in float32 were its bound past
    float16's range, and in float32 on MLX's CPU device: its estimated KV cache follows. Judged from the header alone
    (before a download, the post-norm weights cannot be read) it is counted in float32, the larger."""
    from engine.backends import mlx_compute
    from engine.memory_estimate import estimate_memory, kv_cache_bytes, kv_layout

    monkeypatch.setattr(platform_mlx, "default_device_is_gpu", lambda: on_gpu)
    if bound_past_float16:
        monkeypatch.setattr(mlx_compute, "post_norm_bound", lambda gguf, config: FLOAT16_MAX * 1.01)
    rings = kv_layout("mlx").ring_slots
    with read_gguf(model_path("gemma3")) as gguf:
        config = ModelConfig.from_gguf(gguf)
        estimate = estimate_memory(gguf, 2048, "mlx")
    assert estimate.kv_cache_bytes == kv_cache_bytes(config, 2048, element, True, rings(config, 2048))
    before_download = estimate_memory(header_of(model_path("gemma3")), 2048, "mlx")
    assert before_download.kv_cache_bytes == kv_cache_bytes(config, 2048, 4, True, rings(config, 2048))


def test_an_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="unknown MLX compute dtype 'float8'"):
        ComputeDtype("float8", "no such thing")


@pytest.mark.mlx
@pytest.mark.parametrize("on_gpu", [True, False], ids=["gpu", "cpu"])
def test_the_backend_computes_in_the_dtype_the_policy_picks_for_its_device(on_gpu, monkeypatch):
    import mlx.core as mx

    from engine.backends.mlx_backend import MlxBackend

    monkeypatch.setattr(platform_mlx, "default_device_is_gpu", lambda: on_gpu)
    with read_gguf(model_path("smollm2")) as gguf:
        config = ModelConfig.from_gguf(gguf)
        backend = MlxBackend(gguf, config)
        expected = choose_for_file(gguf, config, on_gpu)
    try:
        assert backend.compute == expected and backend.dtype == getattr(mx, expected.name)
        assert backend.compute_note == f"MLX compute {expected.describe()}"
        cache = backend.new_cache(8)
        backend.forward([1, 2, 3], cache)
        assert all(array.dtype == backend.dtype for array in cache.arrays())  # the KV cache holds that dtype
    finally:
        backend.close()


@pytest.mark.mlx
def test_the_default_device_check_reads_mlx():
    import mlx.core as mx

    assert platform_mlx.default_device_is_gpu() == (mx.default_device().type == mx.gpu)


@pytest.mark.parametrize("name", sorted(GPU_DTYPES))
def test_inspect_states_the_mlx_compute_dtype_and_why(name, capsys):
    assert main(["inspect", str(model_path(name)), "--backend", "numpy"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("MLX compute dtype: ")]
    gpu, cpu, _ = choices(name)
    assert line == (f"MLX compute dtype: {GPU_DTYPES[name]} on a Mac GPU ({gpu.reason}); "
                    f"float32 on MLX's CPU device ({cpu.reason})")
    assert main(["inspect", str(model_path(name)), "--backend", "numpy", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["mlx_compute"]
    assert data == {"gpu": {"name": GPU_DTYPES[name], "reason": gpu.reason},
                    "cpu": {"name": "float32", "reason": cpu.reason}}
