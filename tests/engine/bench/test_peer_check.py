"""A llama.cpp peer that would die in the bench's own process is found in a child first, and any peer that dies
of an illegal instruction (llama.cpp's AMX kernels on some Xeons) is reported with the way out."""

from __future__ import annotations

import signal

import pytest

from engine.bench import peer_check
from engine.bench.llama_bench import run_llama_bench
from tests.model_store import model_path

SELF_SIGILL = "import os, signal; os.kill(os.getpid(), signal.SIGILL)"


def test_an_exit_is_said_in_words():
    assert "-mno-amx-int8" in peer_check.describe_exit(-signal.SIGILL) and "SIGILL" in peer_check.describe_exit(-4)
    assert peer_check.describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert peer_check.describe_exit(2) == "exit status 2"


def test_the_installed_peer_passes_the_check_on_a_real_model(monkeypatch):
    peer_check.check_llama_cpp_runs.__wrapped__(model_path("smollm2"))
    # the load and prefill the child runs where the library has AMX kernels, taken here whatever it has
    always = peer_check.PROBE.replace('"AMX_INT8 = 1" in llama_cpp', '"" in llama_cpp')
    assert always != peer_check.PROBE
    monkeypatch.setattr(peer_check, "PROBE", always)
    peer_check.check_llama_cpp_runs.__wrapped__(model_path("smollm2"))
    with pytest.raises(RuntimeError, match="cannot run missing.gguf here"):
        peer_check.check_llama_cpp_runs.__wrapped__(model_path("smollm2").with_name("missing.gguf"))


def test_a_peer_that_dies_in_the_child_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(peer_check, "PROBE", SELF_SIGILL)
    with pytest.raises(RuntimeError, match=r"cannot run m\.gguf here \(killed by SIGILL.*llama.cpp PR #26954"):
        peer_check.check_llama_cpp_runs.__wrapped__("/nowhere/m.gguf")
    monkeypatch.setattr(peer_check, "PROBE", "import sys; sys.exit('no llama_cpp')")
    with pytest.raises(RuntimeError, match=r"\(exit status 1\): no llama_cpp"):
        peer_check.check_llama_cpp_runs.__wrapped__("/nowhere/m.gguf")


def test_a_llama_bench_killed_by_sigill_says_how_to_build_it(tmp_path):
    binary = tmp_path / "llama-bench"
    binary.write_text("#!/bin/sh\nkill -ILL $$\n")
    binary.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"llama-bench failed \(killed by SIGILL.*-mno-amx-tile"):
        run_llama_bench(binary, model_path("smollm2"), 8, 2, 1)
