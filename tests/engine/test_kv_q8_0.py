"""The opt-in q8_0 KV cache of the fused C decoder: llama.cpp's blocks of the rotated keys and values, attention
that reads them as the float values they hold, snapshots, refusals, and its memory in the estimate.

Tiny random models: ``qwen2`` quantized has 64-wide heads (rotated by a 64-point Walsh-Hadamard transform, biases,
one kv head for four query heads); ``gemma3`` in float32 has 32-wide heads (no rotation, sliding windows).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from engine.backends import create_backend
from engine.backends.cpu.decoder import CpuKVCache, q8_0_rotation
from engine.backends.cpu_backend import CpuBackend
from engine.config import ModelConfig
from engine.gguf_file import read_gguf
from engine.memory_estimate import estimate_memory
from tests.engine.test_cpu_decoder import model_file, prompt  # noqa: F401 - the fixture

Q8_0 = GGMLQuantizationType.Q8_0


def backend(path, kv_type: str) -> CpuBackend:
    gguf = read_gguf(path)
    return CpuBackend(gguf, ModelConfig.from_gguf(gguf), kv_dtype=kv_type)


def sylvester(n: int) -> np.ndarray:
    """Sylvester's Hadamard matrix over sqrt(n), written out, not with the code under test."""
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), h)
    return h / np.sqrt(n)


def test_rotation_sizes_are_llama_cpps():
    assert [q8_0_rotation(d, False) for d in (32, 64, 96, 128, 192, 256)] == [0, 64, 0, 128, 64, 256]
    assert [q8_0_rotation(d, True) for d in (32, 64, 128, 256)] == [0, 64, 64, 64]


@pytest.mark.parametrize("arch, quantized", [("qwen2", True), ("gemma3", False)])
def test_the_cache_holds_llama_cpp_blocks_of_the_rotated_keys_and_values(model_file, arch, quantized):
    """Layer 0's keys and values depend on the tokens alone: the q8_0 cache holds what gguf's quantizer makes
    of the float32 run's rows turned by the Hadamard matrix (a code may differ by one where the rotation's
    float rounding lands on a tie)."""
    path = model_file(arch, quantized)
    f32, q8 = backend(path, "f32"), backend(path, "q8_0")
    c = f32.config
    exact, cache = f32.new_cache(64), q8.new_cache(64)
    ids = prompt(40)
    f32.forward(ids, exact)
    q8.forward(ids, cache)
    assert cache.k.dtype == np.uint8 and cache.k.shape[-1] == c.head_dim // 32 * 34
    for stored, floats, is_values in ((cache.k[0], exact.k[0], False), (cache.v[0], exact.v[0], True)):
        rot = q8_0_rotation(floats.shape[-1], is_values)
        assert rot == (64 if c.head_dim == 64 else 0)
        rows = floats[:, :40].astype(np.float64)
        if rot:
            rows = (rows.reshape(*rows.shape[:-1], -1, rot) @ sylvester(rot)).reshape(rows.shape)
        want = quantize(rows.astype(np.float32), Q8_0)
        got = stored[:, :40]
        assert np.mean(got == want) > 0.99
        step = np.abs(rows).max() / 127
        np.testing.assert_allclose(dequantize(got, Q8_0), dequantize(want, Q8_0), rtol=0, atol=1.01 * step)


@pytest.mark.parametrize("arch, quantized", [("qwen2", True), ("gemma3", False)])
def test_attention_reads_the_values_the_cache_holds(model_file, arch, quantized):
    """A float32 cache given the q8_0 cache's values (turned back) continues as the q8_0 cache does: prompt
    rows (one C call, key chunks of 256) and decode steps differ only by the new rows' own rounding to q8_0."""
    path = model_file(arch, quantized)
    f32, q8 = backend(path, "f32"), backend(path, "q8_0")
    cache, twin = q8.new_cache(1024), f32.new_cache(1024)
    q8.forward(prompt(300), cache)
    twin.import_state(cache.export_state())
    np.testing.assert_array_equal(twin.export_state().keys[1], cache.export_state().keys[1])
    for ids in (prompt(20, seed=3), [5], [9]):
        got, want = q8.forward(ids, cache, all_logits=True), f32.forward(ids, twin, all_logits=True)
        assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()
        twin.import_state(cache.export_state())  # both on the same stored values again


def test_a_float32_cache_of_noise_would_fail_the_attention_check(model_file):
    """The check above can fail: the same continuation over a cache whose values were perturbed by ten
    quantization steps is far off."""
    f32, q8 = backend(model_file("qwen2", True), "f32"), backend(model_file("qwen2", True), "q8_0")
    cache, twin = q8.new_cache(512), f32.new_cache(512)
    q8.forward(prompt(300), cache)
    state = cache.export_state()
    rng = np.random.default_rng(0)
    noisy = type(state)(keys=[k + 10 * np.abs(k).max() / 127 * rng.standard_normal(k.shape).astype(np.float32)
                              for k in state.keys], values=state.values, n_past=state.n_past)
    twin.import_state(noisy)
    got, want = q8.forward([5], cache), f32.forward([5], twin)
    assert np.abs(got - want).max() > 0.05 * np.abs(want).max()


def test_snapshots_round_trip(model_file):
    q8 = backend(model_file("qwen2", True), "q8_0")
    cache = q8.new_cache(128)
    q8.forward(prompt(50), cache)
    state = cache.export_state()
    c = q8.config
    assert all(k.dtype == np.float32 and k.shape == (c.n_kv_heads, 50, c.head_dim) for k in state.keys)
    other = q8.new_cache(128)
    other.import_state(state)
    assert np.mean(other.k[:, :, :50] == cache.k[:, :, :50]) > 0.999
    np.testing.assert_allclose(q8.forward([7], other), q8.forward([7], cache), atol=1e-3)


def test_decode_steps_equal_the_rows_of_one_pass_bit_for_bit(model_file):
    """What speculative verification rests on holds for q8_0 too."""
    q8 = backend(model_file("qwen2", True), "q8_0")
    ids = prompt(300)
    full = q8.forward(ids, q8.new_cache(512), all_logits=True)
    cache = q8.new_cache(512)
    q8.forward(ids[:290], cache)
    for i in range(290, 300):
        np.testing.assert_array_equal(q8.forward([ids[i]], cache), full[i])


def test_q8_0_is_refused_where_it_cannot_run(model_file):
    with pytest.raises(ValueError, match="multiples of 32"):
        backend(model_file("llama", False), "q8_0")  # 16-wide heads
    with pytest.raises(ValueError, match="must be one of"):
        backend(model_file("qwen2", True), "q4_0")
    gguf = read_gguf(model_file("qwen2", True))
    with pytest.raises(ValueError, match="cpu backend only"):
        create_backend("numpy", gguf, ModelConfig.from_gguf(gguf), kv_type="q8_0")
    with pytest.raises(ValueError, match="not an option"):
        estimate_memory(gguf, 256, "numpy", kv_type="q8_0")


@pytest.mark.parametrize("kv_type, per_element", [("f16", 2), ("q8_0", 34 / 32), ("f32", 4)])
def test_the_memory_estimate_counts_the_cache_it_makes(model_file, kv_type, per_element):
    path = model_file("qwen2", True)
    gguf, cpu = read_gguf(path), backend(path, kv_type)
    cache = cpu.new_cache(1000)
    cache.reserve(1000)
    assert isinstance(cache, CpuKVCache) and cache.nbytes == cache.k.nbytes + cache.v.nbytes
    estimate = estimate_memory(gguf, 1000, "cpu", kv_type=kv_type)
    assert estimate.kv_cache_bytes == cache.nbytes
    c = cpu.config
    assert cache.nbytes == round(1000 * c.n_layers * c.n_kv_heads * 2 * c.head_dim * per_element)
    if kv_type == "q8_0":
        assert estimate.kv_cache_bytes == round(estimate_memory(gguf, 1000, "cpu").kv_cache_bytes * 34 / 64)
