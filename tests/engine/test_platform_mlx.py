"""Platform checks for MLX with a faked Mac: the Metal check, the won't-fit error and the wired-memory limit."""

from __future__ import annotations

import platform
import sys
from types import SimpleNamespace

import mlx.core as mx
import pytest

from engine.backends import platform_mlx
from engine.backends.mlx_backend import MlxBackend
from engine.backends.mlx.weights import mlx_weight_bytes
from engine.config import ModelConfig
from engine.gguf_file import read_gguf

pytestmark = pytest.mark.mlx
GiB = 1 << 30


@pytest.fixture
def fake_mac(monkeypatch):
    """An Apple-Silicon Mac with Metal: 16 GiB, 10 GiB recommended working set; wired-limit calls recorded."""
    calls = []
    state = SimpleNamespace(metal=True, wired=0, calls=calls,
                            info={"memory_size": 16 * GiB, "max_recommended_working_set_size": 10 * GiB})

    def set_wired_limit(limit):
        calls.append(limit)
        previous, state.wired = state.wired, limit
        return previous

    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    monkeypatch.setattr(mx.metal, "is_available", lambda: state.metal)
    monkeypatch.setattr(mx, "device_info", lambda: dict(state.info))
    monkeypatch.setattr(mx, "set_wired_limit", set_wired_limit)
    return state


@pytest.fixture
def fake_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(mx, "set_wired_limit", lambda limit: pytest.fail("no wired limit off Metal"))


def test_auto_wants_apple_silicon(fake_linux):
    assert "Apple Silicon" in platform_mlx.unavailable_reason(require_metal=True)
    assert platform_mlx.unavailable_reason(require_metal=False) is None  # mlx[cpu] is enough for backend="mlx"


def test_a_mac_without_metal_is_refused_for_auto(fake_mac):
    fake_mac.metal = False
    assert platform_mlx.unavailable_reason(require_metal=True) == "Metal is not available"
    assert platform_mlx.metal_memory() is None
    fake_mac.metal = True
    assert platform_mlx.unavailable_reason(require_metal=True) is None


def test_metal_memory_reads_the_device_info(fake_mac):
    assert platform_mlx.metal_memory() == platform_mlx.MetalMemory(16 * GiB, 10 * GiB)


def test_no_metal_memory_off_a_mac(fake_linux):
    assert platform_mlx.metal_memory() is None


def test_won_t_fit_names_both_sizes(fake_mac):
    platform_mlx.check_fits(9 * GiB, "small.gguf")
    with pytest.raises(platform_mlx.ModelDoesNotFitError, match=r"big\.gguf needs 11\.8 GB .* working set is 10\.7 GB"):
        platform_mlx.check_fits(11 * GiB, "big.gguf")


def test_won_t_fit_off_metal_uses_available_memory(fake_linux, monkeypatch):
    monkeypatch.setattr(platform_mlx.psutil, "virtual_memory", lambda: SimpleNamespace(available=2 * GiB))
    platform_mlx.check_fits(GiB, "ok.gguf")
    with pytest.raises(platform_mlx.ModelDoesNotFitError, match="memory available now"):
        platform_mlx.check_fits(3 * GiB, "big.gguf")


def test_wired_limit_is_capped_at_the_working_set_and_restored(fake_mac):
    fake_mac.wired = 123
    previous = platform_mlx.wire_memory(4 * GiB)
    assert previous == 123 and fake_mac.wired == 4 * GiB
    platform_mlx.wire_memory(64 * GiB)
    assert fake_mac.wired == 10 * GiB  # never past what Metal recommends
    platform_mlx.restore_wired_limit(previous)
    assert fake_mac.wired == 123


def test_no_wired_limit_off_metal(fake_linux):
    assert platform_mlx.wire_memory(GiB) is None
    platform_mlx.restore_wired_limit(None)


def test_backend_refuses_a_model_that_cannot_fit_before_loading(fake_mac, tiny_model_path, monkeypatch):
    gguf = read_gguf(tiny_model_path)
    fake_mac.info["max_recommended_working_set_size"] = mlx_weight_bytes(gguf) - 1
    monkeypatch.setattr("engine.backends.mlx_backend.TensorReader", lambda g: pytest.fail("weights were read"))
    with pytest.raises(platform_mlx.ModelDoesNotFitError, match="tiny-llama.gguf"):
        MlxBackend(gguf, ModelConfig.from_gguf(gguf))


def test_backend_wires_its_weights_and_restores_on_close(fake_mac, tiny_model_path):
    gguf = read_gguf(tiny_model_path)
    backend = MlxBackend(gguf, ModelConfig.from_gguf(gguf))
    assert fake_mac.calls == [backend.weights_nbytes()]
    backend.close()
    assert fake_mac.calls[-1] == 0 and fake_mac.wired == 0


def test_weight_estimate_is_exact(tiny_model_path):
    gguf = read_gguf(tiny_model_path)
    assert mlx_weight_bytes(gguf) == MlxBackend(gguf, ModelConfig.from_gguf(gguf)).weights_nbytes()
