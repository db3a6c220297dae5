"""Session snapshots: exact continuation after restore, refusal of bad files, crash-safe writes."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import engine.model
from engine.atomic_write import atomic_write
from engine.sampling import SamplingParams
from engine.backends.base import KVState
from engine.session import FORMAT_VERSION, Session, SessionError, read_conversation, read_header, save_session
from tests.engine.gguf_builders import write_tiny_llama

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    model = engine.model.load(tiny_model_path, backend="numpy", n_ctx=512)
    yield model
    model.close()


def run(model, ids, n, params=GREEDY, sampler_state=None):
    return [e.id for e in model.generate_ids(list(ids), params, n, sampler_state=sampler_state)]


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=7)],
                         ids=["greedy", "seeded-sampling"])
def test_continuation_after_restore_is_identical(tiny, tiny_model_path, tmp_path, params):
    prompt = [5, 6, 7, 8, 9]
    uninterrupted = run(tiny, prompt, 12, params)
    first = run(tiny, prompt, 5, params)
    tiny.save_session(tmp_path / "s.hearth", conversation={"messages": [{"role": "user", "content": "hi"}]})
    fresh = engine.model.load(tiny_model_path, backend="numpy", n_ctx=512)
    session = fresh.load_session(tmp_path / "s.hearth")
    assert session.tokens == prompt + first and session.conversation["messages"][0]["content"] == "hi"
    rest = run(fresh, session.tokens, 7, params, sampler_state=session.sampler_state)
    assert first + rest == uninterrupted


def _saved(tiny, tmp_path):
    run(tiny, [5, 6, 7, 8], 3)
    path = tmp_path / "s.hearth"
    tiny.save_session(path, conversation={"messages": [{"role": "user", "content": "keep me"}]})
    return path


def test_snapshot_of_another_model_is_refused_but_its_text_imports(tiny, tmp_path):
    path = _saved(tiny, tmp_path)
    other = engine.model.load(write_tiny_llama(tmp_path / "other.gguf", seed=123), backend="numpy")
    with pytest.raises(SessionError, match="another model"):
        other.load_session(path)
    assert read_conversation(path)["messages"][0]["content"] == "keep me"


def test_truncated_snapshot_is_refused(tiny, tmp_path):
    path = _saved(tiny, tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(SessionError, match="damaged or truncated"):
        tiny.load_session(path)


def test_tampered_payload_fails_the_checksum(tiny, tmp_path):
    path = _saved(tiny, tmp_path)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40  # inside the last KV array
    path.write_bytes(bytes(data))
    with pytest.raises(SessionError, match="checksum"):
        tiny.load_session(path)


def _rewrite_header(path, **changes):
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header["__metadata__"].update(changes)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n:])


def test_future_format_version_is_refused(tiny, tmp_path):
    path = _saved(tiny, tmp_path)
    _rewrite_header(path, version=str(FORMAT_VERSION + 1))
    with pytest.raises(SessionError, match="newer Hearth"):
        tiny.load_session(path)


def test_wrong_shapes_are_refused(tiny, tmp_path):
    run(tiny, [5, 6, 7, 8], 3)
    good = tiny._cache.export_state()
    narrow = KVState([k[:, :, :-1] for k in good.keys], good.values, good.n_past)  # head_dim one short
    path = tmp_path / "s.hearth"
    save_session(path, Session(tiny.sequence, narrow, tiny.sha256, tiny.name, "numpy", tiny.n_ctx))
    with pytest.raises(SessionError, match="wrong shape"):
        tiny.load_session(path)


def test_pickle_disguised_as_a_snapshot_is_refused_and_never_runs(tiny, tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.hearth"
    path.write_bytes(pickle.dumps(Payload()))
    with pytest.raises(SessionError, match="not a Hearth session"):
        tiny.load_session(path)
    with pytest.raises(SessionError):
        read_header(path)
    assert not marker.exists()


def test_empty_and_random_files_are_refused(tiny, tmp_path):
    for content in (b"", b"\x00" * 7, np.random.default_rng(0).bytes(4096)):
        path = tmp_path / "junk.hearth"
        path.write_bytes(content)
        with pytest.raises(SessionError):
            tiny.load_session(path)


def test_failed_write_leaves_the_previous_file_and_no_temp(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"previous")
    with pytest.raises(RuntimeError):
        with atomic_write(target) as f:
            f.write(b"half")
            raise RuntimeError("disk on fire")
    assert target.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["out.bin"]


def test_sigkill_during_export_leaves_the_previous_file_intact(tmp_path):
    target = tmp_path / "export.bin"
    target.write_bytes(b"previous")
    script = textwrap.dedent(f"""
        import sys, time
        from engine.atomic_write import atomic_write
        with atomic_write({str(target)!r}) as f:
            for _ in range(1000):
                f.write(b"x" * 65536)
                f.flush()
            print("writing", flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert target.read_bytes() == b"previous"
