"""Who may use the server: the bind-address rule, the API key, CORS, and ``hearth serve`` on the command line."""

from __future__ import annotations

import subprocess
import sys

import pytest
from starlette.testclient import TestClient

from engine.serve.app import create_app
from engine.serve.cli import check_bind, is_loopback

from .conftest import MODEL_NAME


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("::1", True), ("localhost", True),
                                            ("127.0.0.2", True), ("0.0.0.0", False), ("192.168.1.5", False),
                                            ("::", False), ("example.com", False)])
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback


def test_binding_a_public_address_needs_an_api_key():
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", "secret")
    with pytest.raises(ValueError, match="api-key"):
        check_bind("0.0.0.0", None)


def test_serve_refuses_a_public_address_without_a_key():
    run = subprocess.run([sys.executable, "-m", "app", "serve", "--model", "x.gguf", "--host", "0.0.0.0"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "--api-key" in run.stderr


def test_serve_is_listed_in_hearth_help():
    run = subprocess.run([sys.executable, "-m", "app", "--help"], capture_output=True, text=True, timeout=120)
    assert "hearth serve" in run.stdout


@pytest.fixture
def keyed_client(live_server):
    app = create_app(live_server.served, api_key="s3cret", allowed_origins=("https://ok.example",),
                     manage_lifetime=False)
    return TestClient(app)


def test_api_key_is_required_but_not_for_health(keyed_client):
    assert keyed_client.get("/health").status_code == 200
    missing = keyed_client.get("/v1/models")
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    assert keyed_client.get("/v1/models", headers={"authorization": "Bearer wrong"}).status_code == 401
    good = keyed_client.get("/v1/models", headers={"authorization": "Bearer s3cret"})
    assert good.status_code == 200 and good.json()["data"][0]["id"] == MODEL_NAME
    assert keyed_client.get("/v1/models", headers={"x-api-key": "s3cret"}).status_code == 200


def test_cors_only_for_listed_origins(keyed_client, live_server):
    headers = {"authorization": "Bearer s3cret"}
    allowed = keyed_client.get("/v1/models", headers={**headers, "origin": "https://ok.example"})
    assert allowed.headers["access-control-allow-origin"] == "https://ok.example"
    other = keyed_client.get("/v1/models", headers={**headers, "origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    plain = TestClient(create_app(live_server.served, manage_lifetime=False))
    assert "access-control-allow-origin" not in plain.get("/v1/models", headers={"origin": "https://ok.example"}).headers
