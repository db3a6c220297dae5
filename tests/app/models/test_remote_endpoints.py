"""Remote endpoints as the model manager keeps them: the saved list never holds the key, which goes to the keyring or
a 0600 file; the engine factory opens remote names as RemoteModels; the library lists each remote model with its
endpoint; removing one forgets the endpoint and its key."""

from __future__ import annotations

import json

import pytest

from app.model_choices import ModelChoices
from app.models import secrets
from app.models.remote_endpoints import RemoteEndpoints, parse_headers
from app.models.secrets import SecretStore
from engine.remote import RemoteError, RemoteModel, remote_ref
from tests.engine.remote.fake_server import KEY
from tests.engine.remote.servers import FakeServer


class MemoryKeyring:
    """A keyring backend holding passwords in a dict (the shape ``keyring`` backends have)."""

    priority = 1

    def __init__(self):
        self.passwords = {}

    def get_password(self, service, user):
        return self.passwords.get((service, user))

    def set_password(self, service, user, password):
        self.passwords[(service, user)] = password

    def delete_password(self, service, user):
        del self.passwords[(service, user)]


@pytest.fixture(scope="module")
def fake():
    server = FakeServer().start()
    yield server
    server.kill()


def test_the_file_store_is_0600_and_narrowed_again(tmp_path):
    store = SecretStore(tmp_path, backend=None)
    store.set("a", "sk-one")
    assert store.path.stat().st_mode & 0o777 == 0o600 and store.get("a") == "sk-one"
    store.path.chmod(0o644)
    assert store.get("a") == "sk-one" and store.path.stat().st_mode & 0o777 == 0o600
    store.delete("a")
    assert store.get("a") is None and "keyring" not in store.where and str(store.path) in store.where


def test_a_keyring_backend_is_used_when_there_is_one(tmp_path):
    ring = MemoryKeyring()
    store = SecretStore(tmp_path, backend=ring)
    store.set("a", "sk-one")
    assert ring.passwords == {(secrets.SERVICE, "a"): "sk-one"} and not store.path.exists()
    store.delete("a")
    store.delete("a")  # nothing stored: no error
    assert "keyring" in store.where


def test_no_usable_keyring_here_means_the_file():
    backend = secrets.keyring_backend()
    assert backend is None or backend.priority > 0


def test_parse_headers():
    assert parse_headers("X-Team: blue\n\nX-Other:  a:b ") == (("X-Team", "blue"), ("X-Other", "a:b"))
    with pytest.raises(ValueError, match="not a header line"):
        parse_headers("no colon here")


def test_adding_keeps_the_key_out_of_the_list_and_opens_remote_models(tmp_path, fake):
    ring = MemoryKeyring()
    endpoints = RemoteEndpoints(tmp_path, SecretStore(tmp_path, backend=ring))
    endpoint = endpoints.add(fake.url("auth"), KEY, (("X-Team", "blue"),), probe=False)
    assert endpoint.models == ("fake", "fake-2") and endpoint.has_key
    assert KEY not in endpoints.path.read_text() and json.loads(endpoints.path.read_text())[0]["headers"]
    ref = remote_ref(endpoint.id, "fake")
    model = endpoints.engine_factory(lambda path, n_ctx: pytest.fail("not a local file"))(ref, 2048)
    assert isinstance(model, RemoteModel) and model.endpoint.api_key == KEY and model.n_ctx == 2048
    assert dict(model.endpoint.headers) == {"X-Team": "blue"}
    local = endpoints.engine_factory(lambda path, n_ctx: ("local", path))("/models/x.gguf", 4096)
    assert local == ("local", "/models/x.gguf")
    choices = ModelChoices(tmp_path, None, scan_dirs=[], remote=endpoints)
    rows = [c for c in choices.list() if c.path.startswith("remote://")]
    assert [r.name for r in rows] == ["fake (remote)", "fake-2 (remote)"]
    assert fake.url("auth") in rows[0].detail and "not probed yet" in rows[0].detail
    plan = choices.plan_removal(ref)
    assert "its key and its 2 models" in plan.message
    choices.remove(ref)
    assert endpoints.list() == [] and ring.passwords == {}
    with pytest.raises(OSError, match="no remote endpoint"):
        endpoints.engine_factory(lambda *a: None)(ref, 2048)


def test_an_endpoint_that_cannot_be_listed_is_not_saved(tmp_path, fake):
    endpoints = RemoteEndpoints(tmp_path, SecretStore(tmp_path, backend=None))
    with pytest.raises(RemoteError, match="refused the API key"):
        endpoints.add(fake.url("auth"), "sk-wrong", probe=False)
    with pytest.raises(RemoteError, match="Cannot reach"):
        endpoints.add("http://127.0.0.1:9/v1", probe=False)
    with pytest.raises(ValueError, match="not an http"):
        endpoints.add("gpu-box:8000")
    assert endpoints.list() == [] and not (tmp_path / secrets.SECRETS_FILE).exists()


def test_refresh_marks_an_endpoint_that_went_away_and_clears_it_when_it_is_back(tmp_path):
    server = FakeServer().start()
    try:
        endpoints = RemoteEndpoints(tmp_path, SecretStore(tmp_path, backend=None))
        endpoint = endpoints.add(server.url("ok"), probe=False)
        server.kill()
        gone = endpoints.refresh(endpoint.id)
        assert "Cannot reach" in gone.problem and gone.models == ("fake", "fake-2")  # kept, with the problem
        rows = ModelChoices(tmp_path, None, scan_dirs=[], remote=endpoints).remote_rows()
        assert rows and all("Cannot reach" in r.problem for r in rows)
        server.start()
        assert endpoints.refresh(endpoint.id).problem == "" and endpoints.get(endpoint.id).problem == ""
    finally:
        server.kill()
