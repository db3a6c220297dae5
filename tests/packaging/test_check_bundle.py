"""check_bundle.py on stand-in bundles: the version comparison and the content checks it makes before a release."""

import engine

GOOD_FILES = [
    "hearth",
    "_internal/builtin/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "_internal/engine/backends/cpu/_kernels.cpython-311-x86_64-linux-gnu.so",
    "_internal/PySide6/Qt/lib/libQt6Gui.so.6",
]


def fake_bundle(root, prints: str, exit_code: int = 0):
    """A folder whose ``hearth`` is a shell script printing ``prints`` (no Python: the check runs it bare)."""
    root.mkdir(parents=True, exist_ok=True)
    script = root / "hearth"
    script.write_text(f"#!/bin/sh\necho '{prints}'\nexit {exit_code}\n")
    script.chmod(0o755)
    return root


def test_source_version_is_the_engine_version(check_bundle):
    assert check_bundle.source_version() == engine.__version__


def test_matching_version_passes(check_bundle, tmp_path):
    bundle = fake_bundle(tmp_path / "b", f"hearth {engine.__version__}")
    assert check_bundle.version_problems(bundle, engine.__version__) == []


def test_other_version_fails(check_bundle, tmp_path):
    bundle = fake_bundle(tmp_path / "b", "hearth 0.0.0-old")
    (problem,) = check_bundle.version_problems(bundle, engine.__version__)
    assert "0.0.0-old" in problem


def test_failing_executable_fails(check_bundle, tmp_path):
    bundle = fake_bundle(tmp_path / "b", "boom", exit_code=3)
    (problem,) = check_bundle.version_problems(bundle, engine.__version__)
    assert "exited 3" in problem


def test_the_version_runs_without_python_on_path(check_bundle, tmp_path):
    env = check_bundle.clean_env(tmp_path)
    assert set(env) == {"HOME", "PATH", "LANG", "QT_QPA_PLATFORM"}
    assert list((tmp_path / "empty-bin").iterdir()) == []
    assert env["PATH"] == str(tmp_path / "empty-bin")


def test_complete_contents_pass(check_bundle, tmp_path):
    assert check_bundle.content_problems(tmp_path, GOOD_FILES) == []


def test_missing_model_and_kernels_are_reported(check_bundle, tmp_path):
    problems = check_bundle.content_problems(tmp_path, ["hearth", "_internal/PySide6/Qt/lib/libQt6Gui.so.6"])
    assert len(problems) == 2
    assert any("built-in model (_internal/builtin/*.gguf) is missing" in p for p in problems)
    assert any("C kernels" in p for p in problems)


def test_excluded_packages_are_reported(check_bundle, tmp_path):
    files = GOOD_FILES + ["_internal/llama_cpp/lib/libllama.so", "_internal/PySide6/Qt/lib/libQt6WebEngineCore.so.6"]
    problems = check_bundle.content_problems(tmp_path, files)
    assert problems == [f"should not be bundled: {f}" for f in files[-2:]]


def test_a_bundle_without_the_xcb_helpers_is_refused(check_bundle, system_libraries, tmp_path):
    from .qt_bundle import carry_like_pyinstaller, qt_bundle

    problems = check_bundle.xcb_problems(qt_bundle(tmp_path / "bare"))
    assert any("does not carry libxcb-icccm.so.4" in p and "install libxcb-icccm4" in p for p in problems)
    assert not any("libxcb.so.1" in p or "libGL.so.1" in p for p in problems)  # the system's, on purpose
    carry = carry_like_pyinstaller(tmp_path / "probe", system_libraries)
    assert check_bundle.xcb_problems(qt_bundle(tmp_path / "full", carry=carry)) == []
    (problem,) = check_bundle.xcb_problems(fake_bundle(tmp_path / "no-qt", "hearth"))
    assert "xcb platform plugin" in problem
