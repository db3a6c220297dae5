"""The MLX compute-dtype policy on the real test models: what it picks on a (faked) Mac GPU and on MLX's CPU device,
that the backend computes in it, and that ``inspect`` says so with the reason."""

from __future__ import annotations

import json

import pytest

from engine.backends import platform_mlx
from engine.backends.mlx_compute import ComputeDtype, choose_compute_dtype
from engine.cli import main
from engine.config import ModelConfig
from engine.gguf_file import read_gguf
from tests.model_store import model_path

# What the policy picks on a Mac GPU, per real model (measurements in engine/backends/mlx_compute.py).
GPU_DTYPES = {"smollm2": "float16", "gemma3": "float16", "qwen25coder": "float16"}


def config_of(name: str) -> ModelConfig:
    with read_gguf(model_path(name)) as gguf:
        return ModelConfig.from_gguf(gguf)


@pytest.mark.parametrize("name", sorted(GPU_DTYPES))
def test_the_policy_picks_each_models_dtype_on_a_gpu_and_float32_on_the_cpu_device(name):
    config = config_of(name)
    gpu = choose_compute_dtype(config, on_gpu=True)
    assert gpu.name == GPU_DTYPES[name] and gpu.reason
    assert choose_compute_dtype(config, on_gpu=False).name == "float32"


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
    try:
        expected = choose_compute_dtype(config, on_gpu)
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
    gpu, cpu = choose_compute_dtype(config_of(name), True), choose_compute_dtype(config_of(name), False)
    assert line == (f"MLX compute dtype: {GPU_DTYPES[name]} on a Mac GPU ({gpu.reason}); "
                    f"float32 on MLX's CPU device ({cpu.reason})")
    assert main(["inspect", str(model_path(name)), "--backend", "numpy", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["mlx_compute"]
    assert data == {"gpu": {"name": GPU_DTYPES[name], "reason": gpu.reason},
                    "cpu": {"name": "float32", "reason": cpu.reason}}
