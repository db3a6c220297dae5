"""Snapshots on the real test models: greedy continuation after restore equals an uninterrupted run, per backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import engine.model
from engine.sampling import SamplingParams
from tests.model_store import model_path

REFERENCE = Path(__file__).parent.parent / "reference"
GREEDY = SamplingParams(temperature=0.0)
FIRST, REST = 8, 12

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["cpu", pytest.param("mlx", marks=pytest.mark.mlx)])
@pytest.mark.parametrize("name", ["smollm2", "gemma3", "qwen25coder"])
def test_greedy_continuation_after_restore_is_identical(tmp_path, name, backend):
    prompt = json.loads((REFERENCE / f"public_{name}.json").read_text())["generate"][2]["prompt"]
    model = engine.model.load(model_path(name), backend=backend, n_ctx=256)
    assert model.backend.name == backend
    ids = model.tokenize(prompt, add_special=True, parse_special=True)
    uninterrupted = [e.id for e in model.generate_ids(ids, GREEDY, FIRST + REST)]
    first = [e.id for e in model.generate_ids(ids, GREEDY, FIRST)]
    model.save_session(tmp_path / "s.hearth")
    model.close()

    fresh = engine.model.load(model_path(name), backend=backend, n_ctx=256)
    session = fresh.load_session(tmp_path / "s.hearth")
    rest = [e.id for e in fresh.generate_ids(session.tokens, GREEDY, REST, sampler_state=session.sampler_state)]
    events = list(fresh.generate_ids(session.tokens + rest, GREEDY, 1))
    fresh.close()
    assert first + rest == uninterrupted
    assert events[0].cached_tokens == len(session.tokens) + REST - 1  # nothing before was processed again


@pytest.mark.mlx
def test_a_cpu_snapshot_restores_into_mlx(tmp_path):
    cpu = engine.model.load(model_path("smollm2"), backend="cpu", n_ctx=256)
    ids = cpu.tokenize("The capital of France is", add_special=True, parse_special=True)
    list(cpu.generate_ids(ids, GREEDY, 6))
    cpu.save_session(tmp_path / "s.hearth")
    cpu.close()
    mlx = engine.model.load(model_path("smollm2"), backend="mlx", n_ctx=256)
    session = mlx.load_session(tmp_path / "s.hearth")
    restored = mlx.next_token_logits(session.tokens)  # only the last token is computed; the rest comes from the CPU KV
    mlx.close()
    fresh = engine.model.load(model_path("smollm2"), backend="mlx", n_ctx=256)
    recomputed = fresh.next_token_logits(session.tokens)
    fresh.close()
    assert restored.argmax() == recomputed.argmax()
    assert abs(restored - recomputed).max() < 1.0  # the two backends' KV differ by float rounding only
