"""API keys of remote endpoints: in the OS keyring through ``keyring`` where a real backend exists, else in a file
only this user can read (0600) in Hearth's data folder. Keys never go anywhere else (not the endpoint list, logs,
exports or crash reports)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .json_files import read_json, write_json

log = logging.getLogger(__name__)

SERVICE = "Hearth remote endpoints"
SECRETS_FILE = "remote-keys.json"
FILE_MODE = 0o600


def keyring_backend():
    """The keyring backend to use, or None when only a fail/null or plaintext backend is available."""
    try:
        import keyring
        from keyring.backends import fail
    except ImportError:
        return None
    backend = keyring.get_keyring()
    if isinstance(backend, fail.Keyring) or getattr(backend, "priority", 0) <= 0:
        return None
    return backend


class SecretStore:
    """Keeps one secret per endpoint id.

    Args:
        data_dir: Hearth's data folder, for the fallback file.
        backend: a keyring backend; ``keyring_backend()`` by default, None for the file.
    """

    def __init__(self, data_dir: Path, backend: object | None = ...):
        self.path = data_dir / SECRETS_FILE
        self.backend = keyring_backend() if backend is ... else backend

    @property
    def where(self) -> str:
        """Where keys are kept, for the user: the keyring's name or the file."""
        return f"the system keyring ({type(self.backend).__name__})" if self.backend else f"{self.path} (0600)"

    def get(self, endpoint_id: str) -> str | None:
        if self.backend is not None:
            return self.backend.get_password(SERVICE, endpoint_id)
        return self._read().get(endpoint_id)

    def set(self, endpoint_id: str, secret: str) -> None:
        if self.backend is not None:
            self.backend.set_password(SERVICE, endpoint_id, secret)
            return
        keys = self._read()
        keys[endpoint_id] = secret
        write_json(self.path, keys)  # a temporary file from mkstemp: created 0600
        os.chmod(self.path, FILE_MODE)

    def delete(self, endpoint_id: str) -> None:
        if self.backend is not None:
            try:
                self.backend.delete_password(SERVICE, endpoint_id)
            except Exception as e:  # noqa: BLE001 - keyring's PasswordDeleteError: nothing was stored
                log.info("no key to delete for endpoint %s (%s)", endpoint_id, type(e).__name__)
            return
        keys = self._read()
        if keys.pop(endpoint_id, None) is not None:
            write_json(self.path, keys)
            os.chmod(self.path, FILE_MODE)

    def _read(self) -> dict[str, str]:
        if self.path.exists() and self.path.stat().st_mode & 0o077:
            os.chmod(self.path, FILE_MODE)  # someone widened it: narrow it again before reading
        keys = read_json(self.path, {})
        return {str(k): str(v) for k, v in keys.items()} if isinstance(keys, dict) else {}
