"""Remote endpoints the user added on the Models page: their address, extra headers, TLS switch, the models they
list and what each supports. Kept in ``remote-endpoints.json`` in the data folder; keys live in ``SecretStore``.

A remote model is named in conversations by ``engine.remote.remote_ref(endpoint_id, model_id)``; the app's engine
factory (``RemoteEndpoints.engine_factory``) turns that name into an ``engine.remote.RemoteModel``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

from engine.remote import (Capabilities, Endpoint, RemoteClient, RemoteError, RemoteModel, is_remote_ref,
                           parse_remote_ref, remote_ref)
from engine.remote.endpoint import DEFAULT_STALL_TIMEOUT_S

from .json_files import read_json, write_json
from .secrets import SecretStore

log = logging.getLogger(__name__)

ENDPOINTS_FILE = "remote-endpoints.json"
MAX_PROBED = 4  # models probed when an endpoint is listed: a probe makes each answer one token (a server may load it)


@dataclasses.dataclass(frozen=True)
class RemoteEndpoint:
    """One endpoint as saved (never its key: ``has_key`` says whether one is stored)."""

    id: str
    base_url: str
    headers: tuple[tuple[str, str], ...] = ()
    allow_self_signed: bool = False
    has_key: bool = False
    models: tuple[str, ...] = ()
    capabilities: dict = dataclasses.field(default_factory=dict)  # model id -> Capabilities.to_dict() (probed ones)
    problem: str = ""  # why the last listing failed ('' when it worked)
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S  # an answer with no byte for this long ends, marked

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["headers"] = [list(h) for h in self.headers]
        data["models"] = list(self.models)
        return data

    @classmethod
    def from_json(cls, data: dict) -> RemoteEndpoint:
        return cls(str(data["id"]), str(data["base_url"]), tuple((str(n), str(v)) for n, v in data.get("headers", [])),
                   bool(data.get("allow_self_signed")), bool(data.get("has_key")),
                   tuple(str(m) for m in data.get("models", [])), dict(data.get("capabilities", {})),
                   str(data.get("problem", "")), float(data.get("stall_timeout_s", DEFAULT_STALL_TIMEOUT_S)))


@dataclasses.dataclass(frozen=True)
class RemoteModelEntry:
    """A remote model for the library's list."""

    ref: str
    model_id: str
    endpoint: RemoteEndpoint
    capabilities: Capabilities


def parse_headers(text: str) -> tuple[tuple[str, str], ...]:
    """``Name: value`` lines (blank lines skipped); ValueError naming a line without a colon."""
    headers = []
    for line in text.splitlines():
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"not a header line (expected 'Name: value'): {line.strip()!r}")
        headers.append((name.strip(), value.strip()))
    return tuple(headers)


class RemoteEndpoints:
    """The saved endpoints, their keys, and the engine factory that opens their models.

    Args:
        data_dir: Hearth's data folder.
        secrets: where keys are kept (``SecretStore(data_dir)`` by default).
    """

    def __init__(self, data_dir: Path, secrets: SecretStore | None = None):
        self.path = data_dir / ENDPOINTS_FILE
        self.secrets = secrets or SecretStore(data_dir)

    def list(self) -> list[RemoteEndpoint]:
        data = read_json(self.path, [])
        endpoints = []
        for item in data if isinstance(data, list) else []:
            try:
                endpoints.append(RemoteEndpoint.from_json(item))
            except (KeyError, TypeError, ValueError) as e:
                log.warning("skipped a damaged remote endpoint entry (%s)", e)
        return endpoints

    def get(self, endpoint_id: str) -> RemoteEndpoint:
        for endpoint in self.list():
            if endpoint.id == endpoint_id:
                return endpoint
        raise KeyError(f"no remote endpoint {endpoint_id!r} (it was removed)")

    def add(self, base_url: str, api_key: str | None = None, headers: tuple[tuple[str, str], ...] = (),
            allow_self_signed: bool = False, stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
            probe: bool = True) -> RemoteEndpoint:
        """Save an endpoint (its key in the secret store), list its models and (``probe``) ask the first few what
        they support; network I/O, so call it off the GUI thread. Raises ValueError for a bad address or timeout
        and RemoteError when it cannot be listed (then nothing is saved)."""
        Endpoint(base_url, None, headers, allow_self_signed, stall_timeout_s)  # validates before anything is stored
        endpoint_id = hashlib.sha256(base_url.strip().rstrip("/").removesuffix("/v1").encode()).hexdigest()[:12]
        saved = RemoteEndpoint(endpoint_id, base_url.strip(), headers, allow_self_signed, bool(api_key),
                               stall_timeout_s=stall_timeout_s)
        probed = self._probe(saved, api_key, probe)
        if probed.problem:
            raise RemoteError(probed.problem)
        if api_key:
            self.secrets.set(endpoint_id, api_key)
        self._save([e for e in self.list() if e.id != endpoint_id] + [probed])
        return probed

    def refresh(self, endpoint_id: str) -> RemoteEndpoint:
        """List and probe an endpoint again (it came back, or its models changed); its problem is kept if not."""
        endpoint = self.get(endpoint_id)
        refreshed = self._probe(endpoint, self.secrets.get(endpoint_id) if endpoint.has_key else None)
        if refreshed.problem:
            refreshed = dataclasses.replace(endpoint, problem=refreshed.problem)
        self._save([refreshed if e.id == endpoint_id else e for e in self.list()])
        return refreshed

    def remove(self, endpoint_id: str) -> None:
        self.secrets.delete(endpoint_id)
        self._save([e for e in self.list() if e.id != endpoint_id])

    def models(self) -> list[RemoteModelEntry]:
        return [RemoteModelEntry(remote_ref(e.id, m), m, e, Capabilities.from_dict(e.capabilities.get(m, {})))
                for e in self.list() for m in e.models]

    def entry(self, ref: str) -> RemoteModelEntry:
        endpoint_id, model_id = parse_remote_ref(ref)
        endpoint = self.get(endpoint_id)
        return RemoteModelEntry(ref, model_id, endpoint, Capabilities.from_dict(endpoint.capabilities.get(model_id,
                                                                                                             {})))

    def endpoint(self, endpoint_id: str) -> Endpoint:
        """The engine's ``Endpoint`` for a saved endpoint, with its key from the secret store."""
        saved = self.get(endpoint_id)
        return Endpoint(saved.base_url, self.secrets.get(endpoint_id) if saved.has_key else None, saved.headers,
                        saved.allow_self_signed, saved.stall_timeout_s)

    def open_model(self, ref: str, n_ctx: int) -> RemoteModel:
        endpoint_id, model_id = parse_remote_ref(ref)
        entry = self.entry(ref)
        return RemoteModel(self.endpoint(endpoint_id), model_id, n_ctx, entry.capabilities)

    def engine_factory(self, local: Callable[[str, int], object]) -> Callable[[str, int], object]:
        """The worker's engine factory: remote names open a ``RemoteModel``, anything else goes to ``local``."""
        def factory(path: str, n_ctx: int):
            if is_remote_ref(path):
                try:
                    return self.open_model(path, n_ctx)
                except KeyError as e:
                    raise OSError(str(e).strip("'\"")) from None
            return local(path, n_ctx)
        return factory

    # -- internals ---------------------------------------------------------------------------------------
    def _probe(self, endpoint: RemoteEndpoint, api_key: str | None, probe: bool = True) -> RemoteEndpoint:
        client = RemoteClient(Endpoint(endpoint.base_url, api_key, endpoint.headers, endpoint.allow_self_signed,
                                       endpoint.stall_timeout_s))
        try:
            models = client.list_models()
            capabilities = {m: client.probe(m).to_dict() for m in models[:MAX_PROBED]} if probe else {}
        except RemoteError as e:
            return dataclasses.replace(endpoint, problem=str(e))
        return dataclasses.replace(endpoint, models=tuple(models), capabilities=capabilities, problem="")

    def _save(self, endpoints: list[RemoteEndpoint]) -> None:
        write_json(self.path, [e.to_json() for e in endpoints])
