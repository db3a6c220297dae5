"""``python -m engine inspect``: the verdict first, one line per reason a file will not load, and in --json."""

from __future__ import annotations

import json
import subprocess
import sys

from engine.cli import main
from engine.ggml_types import GGMLQuantizationType
from tests.engine.header_builders import model_header, write_model_file


def inspect(capsys, *args) -> tuple[int, str]:
    code = main(["inspect", *map(str, args)])
    return code, capsys.readouterr().out


def test_a_supported_file_runs_here_and_says_what_it_needs(tmp_path, capsys):
    path = write_model_file(tmp_path / "llama.gguf", model_header("llama"))
    code, out = inspect(capsys, path, "--backend", "cpu", "--n-ctx", "1024")
    first, second = out.splitlines()[:2]
    assert code == 0 and first.startswith("runs here (cpu backend), needs ") and first.endswith("MiB at n_ctx 1024")
    assert second.startswith("llama  ") and "won't load" not in out
    code, out = inspect(capsys, path, "--backend", "cpu", "--json")
    data = json.loads(out)
    assert data["runs"] is True and data["reasons"] == [] and data["architecture"] == "llama"
    assert data["memory_estimate"]["total_bytes"] == data["memory_estimates"]["cpu"]["total_bytes"] > 0


def test_an_unsupported_architecture_is_named_in_one_line(tmp_path, capsys):
    header = model_header("llama")
    header.metadata = {k.replace("llama.", "rwkv7."): v for k, v in header.metadata.items()}
    header.metadata["general.architecture"] = "rwkv7"
    path = write_model_file(tmp_path / "rwkv7.gguf", header)
    code, out = inspect(capsys, path, "--backend", "cpu")
    (line,) = [line for line in out.splitlines() if line.startswith("won't load")]
    assert code == 0 and out.splitlines()[0] == line
    assert line.startswith("won't load (cpu backend): unsupported architecture 'rwkv7' (supported: ")
    data = json.loads(inspect(capsys, path, "--backend", "cpu", "--json")[1])
    assert data["runs"] is False and data["reasons"] == [line.removeprefix("won't load (cpu backend): ")]
    assert data["memory_estimate"] is None and data["architecture"] == "rwkv7"


def test_an_unsupported_type_is_named_in_one_line(tmp_path, capsys):
    path = write_model_file(tmp_path / "q81.gguf", model_header("llama").with_types(GGMLQuantizationType.Q8_1))
    out = inspect(capsys, path, "--backend", "cpu")[1]
    assert out.splitlines()[0] == "won't load (cpu backend): tensor type Q8_1 (16 tensors) has no CPU kernel"
    assert "estimated memory on cpu" in out  # the config is valid, so the memory is still estimated


def test_a_malformed_file_is_an_error_not_a_verdict(tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF" + b"\xff" * 40)
    run = subprocess.run([sys.executable, "-m", "engine", "inspect", str(path)], capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.startswith("error: ") and run.stdout == ""
