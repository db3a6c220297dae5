"""The built-in model is assembled from its part packages once: in order, checked, atomically, and trusted later."""

import dataclasses
import importlib.metadata
import os
import shutil
from pathlib import Path

import pytest

from app import builtin_model as bm
from app.builtin_model import AssemblyCancelled, BuiltinModel, BuiltinModelError, BuiltinModelMissingError

from .builtin_parts import install_fake_parts

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, b"second part " * 700, b"tail"]


@pytest.fixture
def parts(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(bm, "CHUNK_BYTES", 1024)  # several progress steps per part
    return install_fake_parts(site, CHUNKS)


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_parts_are_found_through_their_file_lists_in_order(parts):
    files = BuiltinModel(parts, Path("unused")).part_files()
    assert [f.name for f in files] == ["part01.bin", "part02.bin", "part03.bin"]
    assert [f.read_bytes() for f in files] == CHUNKS


def test_assembly_concatenates_in_order_reports_progress_and_stamps(parts, tmp_path):
    model = BuiltinModel(parts, tmp_path / "builtin")
    assert not model.is_ready()
    seen = []
    path = model.ensure(lambda done, total: seen.append((done, total)))
    assert path == tmp_path / "builtin" / "fake.gguf" and path.read_bytes() == b"".join(CHUNKS)
    assert seen[0] == (0, parts.size) and seen[-1] == (parts.size, parts.size) and len(seen) > len(CHUNKS)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert model.is_ready() and leftovers(tmp_path / "builtin") == ["fake.gguf", "fake.gguf.verified"]


def test_a_stamped_file_is_reused_without_reading_the_parts(parts, tmp_path, monkeypatch):
    model = BuiltinModel(parts, tmp_path / "builtin")
    model.ensure()
    monkeypatch.setattr(BuiltinModel, "part_files", lambda self: pytest.fail("the parts were read again"))
    seen = []
    assert BuiltinModel(parts, tmp_path / "builtin").ensure(lambda *a: seen.append(a)) == model.path and seen == []


def test_a_damaged_file_loses_its_stamp_and_is_rebuilt(parts, tmp_path):
    model = BuiltinModel(parts, tmp_path / "builtin")
    model.ensure()
    with open(model.path, "r+b") as f:  # same size, other bytes, new mtime
        f.write(b"XXXX")
    os.utime(model.path, ns=(1, 1))
    assert not model.is_ready()
    assert model.ensure().read_bytes() == b"".join(CHUNKS) and model.is_ready()


def test_a_half_written_file_without_a_stamp_is_rebuilt(parts, tmp_path):
    directory = tmp_path / "builtin"
    directory.mkdir()
    (directory / "fake.gguf").write_bytes(CHUNKS[0])  # a copy that died before its stamp
    model = BuiltinModel(parts, directory)
    assert not model.is_ready()
    assert model.ensure().read_bytes() == b"".join(CHUNKS)


def test_a_checksum_mismatch_is_an_error_and_leaves_no_file(parts, tmp_path):
    model = BuiltinModel(dataclasses.replace(parts, sha256="0" * 64), tmp_path / "builtin")
    with pytest.raises(BuiltinModelError, match="sha256 .* not the expected 0000"):
        model.ensure()
    assert leftovers(tmp_path / "builtin") == [] and not model.is_ready()


def test_parts_of_the_wrong_size_are_refused_before_writing(parts, tmp_path):
    model = BuiltinModel(dataclasses.replace(parts, size=parts.size + 1), tmp_path / "builtin")
    with pytest.raises(BuiltinModelError, match="must all be version 0.9.0"):
        model.ensure()
    assert leftovers(tmp_path / "builtin") == []


def test_a_missing_part_package_is_named(parts, tmp_path):
    spec = dataclasses.replace(parts, parts=parts.parts + ("hearth-no-such-part",))
    with pytest.raises(BuiltinModelMissingError, match="'hearth-no-such-part'.*not installed.*pip install "
                                                       "hearth-no-such-part==0.9.0"):
        BuiltinModel(spec, tmp_path / "builtin").ensure()
    assert leftovers(tmp_path / "builtin") == []


def test_a_part_package_whose_data_file_is_gone_is_named(parts, tmp_path):
    data = Path(importlib.metadata.distribution("hearth-fake-part2").locate_file("hearth_fake_part2/data"))
    shutil.rmtree(data)
    with pytest.raises(BuiltinModelMissingError, match="'hearth-fake-part2' should hold one data file.*holds 0"):
        BuiltinModel(parts, tmp_path / "builtin").ensure()


def test_a_full_disk_is_a_clear_error_before_anything_is_written(parts, tmp_path, monkeypatch):
    monkeypatch.setattr(bm.shutil, "disk_usage", lambda _path: shutil._ntuple_diskusage(10**9, 10**9 - 100, 100))
    with pytest.raises(BuiltinModelError, match="not enough disk space .*HEARTH_BUILTIN_DIR"):
        BuiltinModel(parts, tmp_path / "builtin").ensure()
    assert leftovers(tmp_path / "builtin") == []


def test_the_disk_filling_up_while_writing_is_a_clear_error_and_leaves_no_file(parts, tmp_path, monkeypatch):
    def no_space(done, total):
        if done > 2000:
            raise OSError(28, "No space left on device")

    with pytest.raises(BuiltinModelError, match="not enough disk space"):
        BuiltinModel(parts, tmp_path / "builtin").ensure(no_space)
    assert leftovers(tmp_path / "builtin") == []


def test_cancelling_stops_and_leaves_no_file(parts, tmp_path):
    calls = []
    with pytest.raises(AssemblyCancelled):
        BuiltinModel(parts, tmp_path / "builtin").ensure(cancelled=lambda: calls.append(1) or len(calls) > 2)
    assert leftovers(tmp_path / "builtin") == []


def test_a_stale_partial_file_of_a_dead_assembly_is_removed(parts, tmp_path):
    directory = tmp_path / "builtin"
    directory.mkdir()
    stale, fresh = directory / "fake.gguf.999999.partial", directory / "fake.gguf.999998.partial"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"y")  # another process may be writing this one right now
    os.utime(stale, (1, 1))
    BuiltinModel(parts, directory).ensure()
    assert leftovers(directory) == ["fake.gguf", "fake.gguf.999998.partial", "fake.gguf.verified"]


def test_the_directory_is_the_env_override_else_the_per_user_data_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(bm.BUILTIN_DIR_ENV, str(tmp_path / "shared"))
    assert BuiltinModel().directory == tmp_path / "shared"
    monkeypatch.delenv(bm.BUILTIN_DIR_ENV)
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path / "one-data-dir"))  # not per data dir: one copy per user
    assert bm.default_builtin_dir().name == "builtin" and "one-data-dir" not in str(bm.default_builtin_dir())
    assert bm.default_builtin_dir().parent.name == "Hearth"


def test_a_frozen_bundle_uses_the_file_it_carries_in_place(parts, tmp_path, monkeypatch):
    bundle = tmp_path / "bundle"
    (bundle / "builtin").mkdir(parents=True)
    (bundle / "builtin" / "fake.gguf").write_bytes(b"".join(CHUNKS))
    monkeypatch.setattr(bm.sys, "frozen", True, raising=False)
    monkeypatch.setattr(bm.sys, "_MEIPASS", str(bundle), raising=False)
    model = BuiltinModel(parts)
    assert model.bundled and model.is_ready() and model.ensure() == bundle / "builtin" / "fake.gguf"
    (bundle / "builtin" / "fake.gguf").write_bytes(b"short")
    assert not BuiltinModel(parts).is_ready()


def test_the_real_parts_make_the_real_built_in_model(builtin_model):
    from tests.model_store import MODELS

    spec = bm.BUILTIN
    assert (spec.file_name, spec.sha256) == (MODELS["qwen25coder"].filename, MODELS["qwen25coder"].sha256)
    assert spec.parts == tuple(p.split("==")[0] for p in MODELS["qwen25coder"].packages)
    assert Path(builtin_model).stat().st_size == spec.size and BuiltinModel().is_ready()
