"""The entry point: --version, dispatch of ``hearth models``, and the end-to-end smoke test."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import engine
from app.builtin_model import BUILTIN_MODEL_NAME
from app.__main__ import main

REPO = Path(__file__).resolve().parents[2]


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"hearth {engine.__version__}"


def test_models_subcommand_goes_to_the_model_library_cli(monkeypatch):
    import app.models.cli

    seen = []
    monkeypatch.setattr(app.models.cli, "main", lambda argv: seen.append(argv) or 7)
    assert main(["models", "list", "--json"]) == 7
    assert seen == [["list", "--json"]]


@pytest.mark.slow
@pytest.mark.gui
def test_smoke_test_chats_and_saves_every_page(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run([sys.executable, "-m", "app", "--smoke-test", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    transcript = json.loads((out / "transcript.json").read_text())
    assert transcript["prompt"] == "Hello! Who are you?" and transcript["reply"].strip()
    assert transcript["stats"]["generated_tokens"] > 0 and transcript["ui_time_to_first_text_s"] > 0
    for name in ("chat", "models", "chat-settings", "chat-dark", "chat-empty", "chat-streaming", "chat-thinking",
                 "chat-thinking-open", "chat-thinking-dark", "chat-two-models", "chat-two-models-dark",
                 "models-add-error", "models-add-error-dark", "defaults", "defaults-dark", "chat-base-model",
                 "chat-base-model-dark", "chat-code", "chat-code-dark", "chat-narrow", "chat-narrow-dark",
                 "server-streaming", "server-streaming-dark"):
        assert (out / f"{name}.png").stat().st_size > 5000, name
    assert transcript["two_models"]["authors"] == ["You", BUILTIN_MODEL_NAME, "You", "SmolLM2 135M Instruct"]
    assert transcript["base_model"]["model_text"].endswith("· base model — text completion")
    sample = transcript["thinking_sample"]  # the Thinking block, shown on a stored sample reply
    assert sample["thinking"].startswith("The user asks whether 97 is prime") and "<think>" not in sample["thinking"]
    counts = sample["stats"]
    assert sample["answer"].startswith("Yes") and 0 < counts["thinking_tokens"] < counts["generated_tokens"]
    server = transcript["server"]  # the Server page was grabbed while API requests streamed in the app's engine
    assert server["running"] >= 4 and server["log"][0]["status"] == 200 and server["log"][0]["completion_tokens"] > 0
    assert transcript["polish_sample"]["shown"] == 2 and len(transcript["polish_sample"]["answers"]) == 3
    remote = transcript["remote"]  # the built-in model behind an in-process hearth serve, used as a remote model
    assert remote["reply"].strip() and remote["stats"]["model_name"] == "hearth-builtin (remote)"
    assert "Requests: " in remote["dashboard_card"] and "errors: 0" in remote["dashboard_card"]
    for name in ("chat-remote", "chat-remote-dark", "dashboard-remote", "models-remote"):
        assert (out / f"{name}.png").stat().st_size > 5000, name
    assert "sk-smoke-" not in (out / "transcript.json").read_text()


def test_help_lists_every_subcommand():
    done = subprocess.run([sys.executable, "-m", "app", "--help"], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0
    assert "hearth models ..." in done.stdout
