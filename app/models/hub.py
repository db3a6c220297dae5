"""A thin client of the Hugging Face Hub for finding GGUF models, and the curated list of good small ones.

``HF_ENDPOINT`` (a mirror, or the test server) is read when a client is made, not when huggingface_hub is
imported; the token is ``HF_TOKEN`` or the saved ``hf auth login`` token unless one is passed in.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import NamedTuple

import httpx2
from huggingface_hub import HfApi, get_token, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

DEFAULT_ENDPOINT = "https://huggingface.co"
CURATED_PATH = Path(__file__).resolve().parents[2] / "resources" / "curated_models.json"


class HubError(Exception):
    """The Hub could not answer; the message says why and, where it can, what to do."""


@dataclasses.dataclass(frozen=True)
class HubModel:
    """A model repository found by a search."""

    repo: str
    downloads: int
    likes: int
    gated: bool
    last_modified: str | None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class HubFile(NamedTuple):
    """A GGUF file in a repository; ``sha256`` is known for LFS files (all large ones)."""

    filename: str
    size: int
    sha256: str | None

    def to_dict(self) -> dict:
        return self._asdict()


@dataclasses.dataclass(frozen=True)
class CuratedModel:
    """A small chat model recommended to people who do not know where to start, with one file picked."""

    repo: str
    filename: str
    title: str
    description: str
    architecture: str
    parameters: str
    license: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class HubClient:
    """Search the Hub and list a repository's GGUF files."""

    def __init__(self, endpoint: str | None = None, token: str | None = None):
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        self._token = token
        self._api = HfApi(endpoint=self.endpoint, token=token)

    @property
    def token(self) -> str | None:
        """The token sent with requests: the one passed in, else ``HF_TOKEN`` or the saved login."""
        return self._token or get_token()

    def search(self, query: str, limit: int = 20) -> list[HubModel]:
        """GGUF model repositories matching ``query``, most downloaded first."""
        try:
            models = list(self._api.list_models(search=query or None, filter="gguf", sort="downloads", limit=limit))
        except Exception as e:
            raise _hub_error(e, f"search for {query!r}", self.endpoint) from None
        return [HubModel(m.id, m.downloads or 0, m.likes or 0, bool(m.gated),
                         m.last_modified.isoformat() if m.last_modified else None) for m in models]

    def list_gguf_files(self, repo: str, revision: str = "main") -> list[HubFile]:
        """``(filename, size, sha256 or None)`` of every ``.gguf`` file in ``repo``, from its file metadata."""
        try:
            info = self._api.model_info(repo, revision=revision, files_metadata=True)
        except Exception as e:
            raise _hub_error(e, repo, self.endpoint) from None
        files = [HubFile(s.rfilename, s.size or 0, s.lfs.sha256 if s.lfs else None)
                 for s in info.siblings or [] if s.rfilename.lower().endswith(".gguf")]
        return sorted(files)

    def file_info(self, repo: str, filename: str, revision: str = "main") -> HubFile:
        """Size and sha256 of one file; raises HubError when the repository has no such GGUF."""
        for f in self.list_gguf_files(repo, revision):
            if f.filename == filename:
                return f
        raise HubError(f"{repo} has no file {filename!r} (see 'hearth models search' for its GGUF files)")

    def file_url(self, repo: str, filename: str, revision: str = "main") -> str:
        return hf_hub_url(repo, filename, revision=revision, endpoint=self.endpoint)


def _hub_error(e: Exception, what: str, endpoint: str) -> HubError:
    """A HubError with a message for people, from whatever huggingface_hub or httpx raised."""
    if isinstance(e, GatedRepoError):
        return HubError(f"{what} is gated: accept its terms on the Hub, then set HF_TOKEN to an access token "
                        "of that account")
    if isinstance(e, RevisionNotFoundError):
        return HubError(f"{what}: no such revision")
    if isinstance(e, RepositoryNotFoundError):
        return HubError(f"{what} was not found on {endpoint} (if it is private, set HF_TOKEN)")
    if isinstance(e, HfHubHTTPError) and e.response is not None:
        code = e.response.status_code
        if code == 401:
            return HubError(f"{what}: the Hub refused the request (401); set HF_TOKEN to a valid access token")
        if code >= 500:
            return HubError(f"{what}: the Hub had a server error ({code}); try again later")
        return HubError(f"{what}: the Hub answered {code}")
    if isinstance(e, HFValidationError):
        return HubError(f"{what!r} is not a valid repository name (expected 'organisation/name')")
    if isinstance(e, OfflineModeIsEnabled):
        return HubError("the Hub is not reachable in offline mode (HF_HUB_OFFLINE is set)")
    if isinstance(e, (httpx2.TransportError, OSError)):
        return HubError(f"cannot reach {endpoint}: {e}")
    return HubError(f"{what}: {e}")


def load_curated(path: Path = CURATED_PATH) -> list[CuratedModel]:
    """The curated models from ``resources/curated_models.json``."""
    try:
        records = json.loads(Path(path).read_text(encoding="utf-8"))["models"]
        return [CuratedModel(**r) for r in records]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HubError(f"the curated model list {path} is unreadable: {e}") from None
