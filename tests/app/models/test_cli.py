"""``hearth models`` end to end against the fake Hub, with a private data folder, HF cache and home."""

from __future__ import annotations

import json

import pytest
from huggingface_hub import constants

from app.models.cli import main
from tests.app.models.conftest import FILE, REPO
from tests.app.models.tiny_gguf import write_tiny_gguf


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    status = main([*argv, "--json"])
    return status, json.loads(capsys.readouterr().out)


def own_models(listing: dict) -> list[str]:
    return [m["name"] for m in listing["models"] if m["source"] != "builtin"]


def test_download_then_list_then_remove(hub, data_dir, capsys, tiny_model):
    status, result = run_json(capsys, "download", REPO, FILE)
    assert status == 0 and result["download"]["state"] == "completed"
    assert result["download"]["path"] == str(data_dir / "models" / "acme" / "Tiny-GGUF" / FILE)
    status, listing = run_json(capsys, "list")
    (model,) = [m for m in listing["models"] if m["source"] == "downloaded"]
    assert (model["name"], model["title"], model["file_size"], model["owned"]) == (f"{REPO}/{FILE}", "Tiny Download", len(tiny_model), True)
    status, refused = run_json(capsys, "remove", model["name"])
    assert status == 1 and "pass --yes to confirm" in refused["error"]
    status, removed = run_json(capsys, "remove", model["name"], "--yes")
    assert status == 0 and removed["deleted"] == [model["path"]]
    assert own_models(run_json(capsys, "list")[1]) == []


def test_download_failure_is_reported_with_exit_status_1(hub, data_dir, capsys):
    hub.faults.status = 404
    status = main(["download", REPO, FILE])
    assert status == 1
    assert "was not found on the Hub (404)" in capsys.readouterr().err


def test_unsafe_download_is_refused(hub, data_dir, capsys):
    status, result = run_json(capsys, "download", REPO, "../../x.gguf")
    assert status == 1 and "refusing the file name" in result["error"]


def test_search_lists_repositories_and_their_files(hub, data_dir, capsys, tiny_model):
    status, result = run_json(capsys, "search", "tiny", "--files")
    assert status == 0
    (repo,) = result["results"]
    assert repo["repo"] == REPO and [f["filename"] for f in repo["files"]] == [FILE]
    assert repo["files"][0]["size"] == len(tiny_model)


def test_search_without_a_query_shows_the_curated_list(data_dir, capsys):
    status, result = run_json(capsys, "search")
    assert status == 0 and len(result["curated"]) >= 5
    assert all(c["filename"].endswith(".gguf") for c in result["curated"])


def test_import_copy_and_link(data_dir, capsys, tmp_path):
    a = write_tiny_gguf(tmp_path / "outside" / "a.gguf")
    b = write_tiny_gguf(tmp_path / "outside" / "b.gguf")
    assert run_json(capsys, "import", str(a))[1]["model"]["owned"] is True
    linked = run_json(capsys, "import", str(b), "--link")[1]["model"]
    assert (linked["owned"], linked["path"]) == (False, str(b))
    assert own_models(run_json(capsys, "list")[1]) == ["imported/a.gguf", "imported/b.gguf"]
    status, bad = run_json(capsys, "import", str(tmp_path / "missing.gguf"))
    assert status == 1 and "is not a file" in bad["error"]


def test_external_models_are_listed_and_protected(data_dir, capsys, tmp_path):
    write_tiny_gguf(tmp_path / "home" / ".lmstudio" / "models" / "pub" / "Repo-GGUF" / "m.gguf")
    listing = run_json(capsys, "list")[1]
    assert own_models(listing) == ["lmstudio/pub/Repo-GGUF/m.gguf"]
    status, refused = run_json(capsys, "remove", "lmstudio/pub/Repo-GGUF/m.gguf", "--yes")
    assert status == 1 and "belongs to LM Studio" in refused["error"]


def test_plain_output_is_a_table(hub, data_dir, capsys):
    assert main(["download", REPO, FILE]) == 0
    captured = capsys.readouterr()
    assert f"Downloaded {REPO}/{FILE}" in captured.out and "completed" in captured.err
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "SOURCE", "ARCH", "QUANT", "PARAMS", "SIZE", "CTX", "STATUS"]
    assert any(line.startswith(f"{REPO}/{FILE}") and line.rstrip().endswith("ok") for line in lines)


def test_download_refuses_a_file_that_cannot_run_unless_told(hub, data_dir, capsys, tmp_path):
    unrunnable = write_tiny_gguf(tmp_path / "rwkv7.gguf", arch="rwkv7", extra_bytes=2 << 20)
    hub.add_file(REPO, "rwkv7.gguf", unrunnable)
    status, refused = run_json(capsys, "download", REPO, "rwkv7.gguf")
    assert status == 1 and refused["error"].startswith(
        f"{REPO}/rwkv7.gguf won't load here: unsupported architecture 'rwkv7' (supported: ")
    assert refused["error"].endswith("pass --anyway to download it all the same")
    assert hub.ranges("rwkv7.gguf") == ["bytes=0-1048575"]  # the header only
    status, result = run_json(capsys, "download", REPO, "rwkv7.gguf", "--anyway")
    assert status == 0 and result["download"]["state"] == "completed"
    status, listing = run_json(capsys, "list")
    (model,) = [m for m in listing["models"] if m["name"] == f"{REPO}/rwkv7.gguf"]
    assert model["supported"] is False and model["runs"] is False and "'rwkv7'" in model["reasons"][0]


def test_import_keeps_a_file_that_cannot_run_only_when_told(data_dir, capsys, tmp_path):
    source = write_tiny_gguf(tmp_path / "outside" / "rwkv7.gguf", arch="rwkv7")
    status, refused = run_json(capsys, "import", str(source), "--link")
    assert status == 1 and refused["error"].startswith("rwkv7.gguf won't load: unsupported architecture 'rwkv7'")
    status, result = run_json(capsys, "import", str(source), "--link", "--anyway")
    assert status == 0 and result["model"]["supported"] is False


def test_list_assembles_the_builtin_model_first_with_progress(data_dir, capsys, tmp_path, monkeypatch):
    from app.builtin_model import BuiltinModel
    from app.models import cli, library
    from tests.app.builtin_parts import install_fake_parts

    gguf = tmp_path / "Builtin.gguf"
    write_tiny_gguf(gguf, name="Builtin")
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    spec = install_fake_parts(site, [gguf.read_bytes()[:500], gguf.read_bytes()[500:]])
    for module in (cli, library):
        monkeypatch.setattr(module, "BuiltinModel", lambda: BuiltinModel(spec, tmp_path / "builtin"))
    status = main(["list", "--json"])
    out, err = capsys.readouterr()
    listing = json.loads(out)
    assert status == 0 and [(m["name"], m["source"]) for m in listing["models"]] == [("builtin/fake.gguf", "builtin")]
    assert "Preparing the built-in model Fake Model" in err and "(100 %)" in err
    assert (tmp_path / "builtin" / "fake.gguf").read_bytes() == gguf.read_bytes()


def test_list_without_a_part_package_warns_and_lists_the_rest(data_dir, capsys, tmp_path, monkeypatch):
    import dataclasses

    from app.builtin_model import BUILTIN, BuiltinModel
    from app.models import cli, library

    spec = dataclasses.replace(BUILTIN, parts=("hearth-no-such-part",))
    for module in (cli, library):
        monkeypatch.setattr(module, "BuiltinModel", lambda: BuiltinModel(spec, tmp_path / "builtin"))
    assert main(["list"]) == 0
    out, err = capsys.readouterr()
    assert "the built-in model is not available" in err and "'hearth-no-such-part'" in err
    assert "No models yet" in out and not (tmp_path / "builtin" / BUILTIN.file_name).exists()
