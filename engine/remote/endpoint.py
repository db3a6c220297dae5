"""Endpoint: where a remote engine is and how to talk to it (address, key, headers, TLS, timeouts, retries)."""

from __future__ import annotations

import dataclasses
from urllib.parse import urlsplit

import httpx

DEFAULT_STALL_TIMEOUT_S = 60.0  # no byte for this long ends a stream (a cold model may take long to its first token)
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_MAX_RETRIES = 3  # for 429 and for a connection refused before any answer text
DEFAULT_MAX_RETRY_WAIT_S = 30.0  # a Retry-After longer than this is not waited for


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server.

    ``base_url`` is the server's address with or without ``/v1`` (``http://host:8000`` and ``http://host:8000/v1``
    are the same endpoint). ``api_key`` is sent as ``Authorization: Bearer``; it is left out of ``repr``.
    ``allow_self_signed`` turns https certificate verification off for this endpoint only.
    """

    base_url: str
    api_key: str | None = dataclasses.field(default=None, repr=False)
    headers: tuple[tuple[str, str], ...] = ()
    allow_self_signed: bool = False
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    max_retries: int = DEFAULT_MAX_RETRIES
    max_retry_wait_s: float = DEFAULT_MAX_RETRY_WAIT_S

    def __post_init__(self):
        parts = urlsplit(self.base_url.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"not an http(s) address: {self.base_url!r} (e.g. http://127.0.0.1:8080/v1)")
        if any(not name.strip() or "\n" in name + value or "\r" in name + value for name, value in self.headers):
            raise ValueError("a header name is empty or a header holds a line break")
        if self.stall_timeout_s <= 0 or self.connect_timeout_s <= 0 or self.max_retries < 0:
            raise ValueError("timeouts must be positive and retries not negative")

    @property
    def root(self) -> str:
        """The server's address without ``/v1`` or a trailing slash (Anthropic's ``/v1/messages`` is under it)."""
        url = self.base_url.strip().rstrip("/")
        return url[:-3] if url.endswith("/v1") else url

    @property
    def api_url(self) -> str:
        """The OpenAI API's base: ``root`` + ``/v1``."""
        return self.root + "/v1"

    def request_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def http_client(self) -> httpx.Client:
        """A client for this endpoint: its headers, verification and timeouts (reads time out at the stall
        timeout, so a stalled stream ends)."""
        timeout = httpx.Timeout(self.stall_timeout_s, connect=self.connect_timeout_s)
        return httpx.Client(headers=self.request_headers(), verify=not self.allow_self_signed, timeout=timeout,
                            follow_redirects=False)
