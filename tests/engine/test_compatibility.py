"""The verdict from a header alone: per architecture and tensor type, against what a real load does, and its reasons."""

from __future__ import annotations

import pytest

import engine.model
from engine.compatibility import check, supported_types
from engine.config import SUPPORTED_ARCHITECTURES
from engine.ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType
from engine.gguf_file import GGUFHeader, IncompleteHeaderError, ModelFormatError, read_gguf
from engine.memory_estimate import estimate_memory
from tests.engine.header_builders import LAYER_TENSORS, header_bytes, model_header, write_model_file

Q = GGMLQuantizationType
BACKENDS = ("cpu", "numpy", pytest.param("mlx", marks=pytest.mark.mlx))
TYPES = sorted(GGML_QUANT_SIZES, key=int)


def header_of(header) -> GGUFHeader:
    data, size = header_bytes(header)
    return GGUFHeader(data, size)


def one_line(reasons) -> str:
    (reason,) = reasons
    assert "\n" not in reason
    return reason


@pytest.mark.parametrize("arch", sorted(LAYER_TENSORS))
def test_each_architecture_runs_exactly_when_the_engine_supports_it(arch):
    verdict = check(header_of(model_header(arch)), "cpu")
    if arch in SUPPORTED_ARCHITECTURES:
        assert verdict.runs and verdict.reasons == (), verdict.reasons
        assert set(verdict.memory) >= {"cpu", "numpy"} and verdict.memory_bytes > 0
    else:
        assert not verdict.runs and f"'{arch}'" in one_line(verdict.reasons)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", sorted(LAYER_TENSORS))
def test_the_verdict_for_each_architecture_is_what_loading_the_file_does(tmp_path, arch, backend):
    """A backend that cannot hold an architecture the config accepts must say so to ``check``, or the verdict lies."""
    path = write_model_file(tmp_path / f"{arch}.gguf", model_header(arch, n_layers=1))
    with read_gguf(path) as g:
        verdict = check(g, backend)
    try:
        engine.model.load(path, backend=backend, n_ctx=64).close()
        loaded = None
    except Exception as e:  # noqa: BLE001 - whatever a backend raises for a model it cannot hold
        loaded = e
    assert verdict.runs == (loaded is None), (verdict.reasons, loaded)


def test_every_supported_architecture_has_a_header_here():
    """A new architecture in the engine needs its tensor table in header_builders to be judged here."""
    assert set(SUPPORTED_ARCHITECTURES) <= set(LAYER_TENSORS)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_the_verdict_for_each_type_is_what_loading_the_file_does(tmp_path, backend, qtype):
    """The header-only verdict against a real load of the same file (zero weights, which every type accepts)."""
    header = model_header("llama", n_layers=1).with_types(qtype)
    verdict = check(header_of(header), backend)
    path = write_model_file(tmp_path / "m.gguf", header)
    try:
        engine.model.load(path, backend=backend, n_ctx=64).close()
        loaded = None
    except Exception as e:  # noqa: BLE001 - whatever a backend raises for a type it cannot hold
        loaded = e
    assert verdict.runs == (loaded is None), (verdict.reasons, loaded)
    if not verdict.runs:
        assert qtype.name in one_line(verdict.reasons) and verdict.reasons[0].startswith("tensor type ")


def test_an_unsupported_type_is_named_with_its_tensor_count():
    header = model_header("llama", n_layers=2).with_types(Q.Q8_1)  # an activation type: no backend holds weights in it
    assert int(Q.Q8_1) not in supported_types("cpu")
    reason = one_line(check(header_of(header), "cpu").reasons)
    assert reason == "tensor type Q8_1 (16 tensors) has no CPU kernel"  # 7 per layer, embedding, output


def test_vectors_of_a_type_no_backend_dequantizes_are_named():
    header = model_header("llama", n_layers=1)
    header.tensors = [(n, s, Q.I32 if len(s) == 1 else q) for n, s, q in header.tensors]
    assert one_line(check(header_of(header), "cpu").reasons) == "tensor type I32 (3 tensors) has no NumPy dequantizer"


def test_an_unknown_architecture_is_named_in_one_line():
    header = model_header("llama")
    header.metadata = {k.replace("llama.", "rwkv7."): v for k, v in header.metadata.items()}
    header.metadata["general.architecture"] = "rwkv7"
    verdict = check(header_of(header), "cpu")
    assert not verdict.runs and verdict.architecture == "rwkv7"
    assert one_line(verdict.reasons).startswith("unsupported architecture 'rwkv7' (supported: llama")
    assert verdict.memory == {}  # no config, no estimate
    assert verdict.parameter_count == sum(t.n_elements for t in header_of(header).tensors.values())


def test_a_missing_required_tensor_is_named():
    verdict = check(header_of(model_header("qwen2").drop("blk.1.attn_k.bias")), "cpu")
    assert "'blk.1.attn_k.bias'" in one_line(verdict.reasons)


def test_a_wrong_shape_is_named():
    verdict = check(header_of(model_header("llama").reshape("blk.0.ffn_down.weight", (512, 128))), "cpu")
    reason = one_line(verdict.reasons)
    assert "'blk.0.ffn_down.weight'" in reason and "(512, 128)" in reason


def test_a_tokenizer_the_engine_lacks_is_named():
    header = model_header("llama")
    header.metadata["tokenizer.ggml.model"] = "rwkv"
    assert one_line(check(header_of(header), "cpu").reasons).startswith("tokenizer: ")


def test_several_problems_give_several_lines():
    header = model_header("llama").with_types(Q.Q8_1).drop("output_norm.weight")
    verdict = check(header_of(header), "cpu")
    assert len(verdict.reasons) == 2 and "'output_norm.weight'" in verdict.reasons[0] and "Q8_1" in verdict.reasons[1]


def test_mlx_asked_for_where_it_cannot_run_says_why(monkeypatch):
    from engine.backends import platform_mlx

    monkeypatch.setattr(platform_mlx, "unavailable_reason", lambda require_metal: "the mlx package is not installed")
    verdict = check(header_of(model_header("llama")), "mlx")
    assert one_line(verdict.reasons) == "the MLX backend cannot run here: the mlx package is not installed"


def test_auto_judges_the_backend_this_machine_would_load(tmp_path):
    path = write_model_file(tmp_path / "m.gguf", model_header("llama", n_layers=1))
    model = engine.model.load(path, backend="auto", n_ctx=64)
    try:
        assert check(header_of(model_header("llama", n_layers=1)), "auto").backend == model.backend.name
    finally:
        model.close()


def test_the_header_alone_gives_the_same_verdict_as_the_whole_file(tmp_path):
    header = model_header("gemma3", qtype=Q.Q4_K)
    path = write_model_file(tmp_path / "g.gguf", header)
    with read_gguf(path) as whole:
        assert check(whole, "cpu").to_dict() == check(header_of(header), "cpu").to_dict()


def test_a_header_cut_short_asks_for_more_bytes_until_it_is_whole():
    data, size = header_bytes(model_header("llama"))
    n = 64
    while True:
        try:
            header = GGUFHeader(data[:n], size)
            break
        except IncompleteHeaderError as e:
            assert e.needed_bytes > n
            n = min(2 * n, len(data))
    assert n >= len(data) - 32 and len(header.tensors) == 21
    with pytest.raises(ModelFormatError, match="only the header"):
        header.raw("token_embd.weight")


def test_a_malformed_header_is_not_mistaken_for_a_short_one():
    data, size = header_bytes(model_header("llama"))
    with pytest.raises(ModelFormatError, match="not a GGUF file") as e:
        GGUFHeader(b"GGUX" + data[4:], size)
    assert not isinstance(e.value, IncompleteHeaderError)
    with pytest.raises(ModelFormatError, match="past the end of the file"):
        GGUFHeader(data, size - 100)  # the last tensor would end past the file


def test_memory_per_backend_from_the_header():
    header = header_of(model_header("llama", n_layers=2, qtype=Q.Q4_0))
    matrices = [t for t in header.tensors.values() if len(t.shape) == 2]
    vectors = [t for t in header.tensors.values() if len(t.shape) == 1]
    cpu, numpy = estimate_memory(header, 1024, "cpu"), estimate_memory(header, 1024, "numpy")
    assert cpu.weights_bytes == sum(t.nbytes for t in header.tensors.values())
    # untied: the embedding stays packed (in the mapped file, counted whole), every other tensor is float32
    embd = header.tensors["token_embd.weight"]
    mapped = cpu.weights_bytes
    assert numpy.weights_bytes == mapped + 4 * sum(t.n_elements for t in matrices + vectors if t is not embd)
    tied = header_of(model_header("gemma3", qtype=Q.Q4_0))
    assert estimate_memory(tied, 1024, "numpy").weights_bytes == sum(t.nbytes for t in tied.tensors.values()) + 4 * sum(
        t.n_elements for t in tied.tensors.values())


@pytest.mark.mlx
def test_the_mlx_estimate_is_its_loaders_figure():
    from engine.backends.mlx.weights import mlx_weight_bytes

    header = header_of(model_header("llama", qtype=Q.Q6_K))
    verdict = check(header, "mlx")
    assert verdict.memory["mlx"].weights_bytes == mlx_weight_bytes(header)
    assert verdict.memory_bytes == verdict.memory["mlx"].total_bytes


def test_a_header_cut_anywhere_asks_for_more_never_calls_the_file_malformed():
    """Every cut, in the metadata, a vocabulary array or the tensor table, is 'read more', reaching past the cut."""
    data, size = header_bytes(model_header("qwen2"))
    table_start = len(data) - 1500  # the tensor table is the header's last ~1.3 KB here
    for n in [*range(0, table_start, 97), *range(table_start, len(data) - 31)]:
        with pytest.raises(IncompleteHeaderError) as e:
            GGUFHeader(data[:n], size)
        assert e.value.needed_bytes > n


def test_judged_estimates_only_the_backend_it_judged():
    verdict = check(header_of(model_header("llama")), "numpy", estimates="judged")
    assert list(verdict.memory) == ["numpy"] and verdict.memory_bytes == verdict.memory["numpy"].total_bytes


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_kv_estimate_is_what_each_backends_cache_allocates(tmp_path, backend):
    """On a Gemma 3 with sliding-window layers (which a ring shrinks), at a context past the window."""
    header = model_header("gemma3", n_layers=6)
    header.metadata["gemma3.attention.sliding_window"] = 256
    path = write_model_file(tmp_path / "g.gguf", header)
    model = engine.model.load(path, backend=backend, n_ctx=2048)
    try:
        cache = model.backend.new_cache(2048)
        cache.reserve(2048)
        assert estimate_memory(model.gguf, 2048, backend).kv_cache_bytes == cache.nbytes
    finally:
        model.close()
