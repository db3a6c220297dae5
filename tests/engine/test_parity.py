"""Parity with llama.cpp on the real test models, for every backend: logits, teacher-forced argmax, greedy text.

"mlx" runs MLX's CPU device as it chooses for itself (float32); "mlx-f16" runs it the way a Mac GPU would: the
device is faked as the GPU while the model loads, so the backend computes in the dtype its policy
(engine/backends/mlx_compute.py) picks for the model there, on the CPU device, every prompt as on the others.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import engine.model
from tests.model_store import model_path

REFERENCE = Path(__file__).parent.parent / "reference"
MODELS = ("smollm2", "gemma3", "qwen25coder")
BACKENDS = (
    pytest.param("numpy", id="numpy"),
    pytest.param("cpu", id="cpu"),
    pytest.param("mlx", id="mlx", marks=pytest.mark.mlx),
    pytest.param("mlx-f16", id="mlx-f16", marks=pytest.mark.mlx),
)
LOGIT_TOLERANCE = 1.0  # llama.cpp quantizes activations to 8 bits; see tests/reference/README.md
STD_TOLERANCE = 0.05  # ... or 5 % of the logits' standard deviation at that position, where that is more
NEAR_TIE = 0.5

pytestmark = pytest.mark.slow


def reference(name: str) -> dict:
    return json.loads((REFERENCE / f"public_{name}.json").read_text(encoding="utf-8"))


_loaded: dict[tuple[str, str], engine.model.Model] = {}


@pytest.fixture(scope="module", params=BACKENDS)
def backend_name(request):
    yield request.param
    for key in [k for k in _loaded if k[1] == request.param]:
        _loaded.pop(key).close()


def get_model(name: str, backend: str) -> engine.model.Model:
    if (name, backend) not in _loaded:
        _loaded[(name, backend)] = load_as_a_mac_gpu(name) if backend == "mlx-f16" else load(name, backend)
    return _loaded[(name, backend)]


def load(name: str, backend: str) -> engine.model.Model:
    model = engine.model.load(model_path(name), backend=backend, n_ctx=2048)
    assert model.backend.name == backend, model.notices
    return model


def load_as_a_mac_gpu(name: str) -> engine.model.Model:
    """The model on MLX with the device faked as the GPU while it loads: the GPU's dtype, on the CPU device."""
    import mlx.core as mx

    from engine.backends import platform_mlx
    from engine.backends.mlx_compute import choose_for_file

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(platform_mlx, "default_device_is_gpu", lambda: True)
        model = load(name, "mlx")
    assert model.backend.compute == choose_for_file(model.gguf, model.config, on_gpu=True)
    assert model.backend.dtype == getattr(mx, model.backend.compute.name)
    return model


def first_near_tie(gaps: list[float]) -> int:
    return next((i for i, g in enumerate(gaps) if g < NEAR_TIE), len(gaps))


@pytest.mark.parametrize("name", MODELS)
def test_teacher_forced_logits_and_argmax(backend_name, name):
    model = get_model(name, backend_name)
    for case in reference(name)["generate"]:
        prompt, greedy = case["prompt_ids"], case["greedy_ids"]
        cache = model.backend.new_cache(len(prompt) + len(greedy))
        logits = model.backend.forward(prompt + greedy, cache, all_logits=True)[len(prompt) - 1:-1]
        assert np.isfinite(logits).all(), f"{case['prompt']!r}: non-finite logits"
        for pos, top10 in enumerate(case["top10_logits_first4"]):
            tolerance = max(LOGIT_TOLERANCE, STD_TOLERANCE * float(logits[pos].std()))
            for token, expected in top10:
                error = abs(logits[pos, token] - expected)
                assert error <= tolerance, f"{case['prompt']!r} position {pos} token {token}: off by {error:.3f}"
        chosen = logits.argmax(axis=-1)
        for pos, (got, want, gap) in enumerate(zip(chosen, greedy, case["top2_gap"])):
            if gap >= NEAR_TIE:
                assert got == want, f"{case['prompt']!r} position {pos}: {got} != llama.cpp {want} (gap {gap:.2f})"


@pytest.mark.parametrize("name", MODELS)
def test_greedy_generation_matches_llama_cpp(backend_name, name):
    model = get_model(name, backend_name)
    for case in reference(name)["generate"]:
        assert model.tokenize(case["prompt"], add_special=True, parse_special=True) == case["prompt_ids"]
        ids = [ev.id for ev in model.generate(case["prompt"], max_tokens=len(case["greedy_ids"]), temperature=0.0)]
        agree = first_near_tie(case["top2_gap"])
        assert ids[:agree] == case["greedy_ids"][:agree], case["prompt"]
        if agree == len(case["greedy_ids"]):
            assert model.detokenize(ids) == case["greedy_text"]


def test_generate_cli_json_ids():
    case = reference("smollm2")["generate"][3]
    out = subprocess.run(
        [sys.executable, "-m", "engine", "generate", str(model_path("smollm2")), "--prompt", case["prompt"],
         "--max-tokens", "40", "--backend", "numpy", "--json"],
        capture_output=True, text=True, check=True, timeout=600,
    )
    result = json.loads(out.stdout)
    agree = first_near_tie(case["top2_gap"])
    assert result["ids"][:agree] == case["greedy_ids"][:agree]
    assert result["finish_reason"] in ("eos", "length")
