"""Load the scripts of packaging/ by path: that folder is no package (its name would shadow PyPI's ``packaging``)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGING = ROOT / "packaging"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"hearth_packaging_{name}", PACKAGING / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def bundle_contents():
    return load("bundle_contents")


@pytest.fixture(scope="session")
def make_icons():
    return load("make_icons")


@pytest.fixture(scope="session")
def check_bundle():
    return load("check_bundle")


@pytest.fixture(scope="session")
def system_libraries():
    return load("system_libraries")


@pytest.fixture(scope="session")
def build_deb():
    return load("build_deb")


@pytest.fixture(scope="session")
def check_deb():
    return load("check_deb")
