"""Typed errors of a remote endpoint: each says what failed in words a user can act on (never the API key)."""

from __future__ import annotations


class RemoteError(Exception):
    """Something went wrong talking to a remote endpoint. ``partial`` is True once answer text had arrived."""

    def __init__(self, message: str, partial: bool = False):
        super().__init__(message)
        self.partial = partial


class EndpointUnreachable(RemoteError):
    """No connection: the server is down, the address is wrong, or TLS failed."""


class AuthenticationFailed(RemoteError):
    """401 or 403: the API key is missing, wrong or not allowed this model."""


class ModelNotFound(RemoteError):
    """404: the endpoint does not serve this model (or this path)."""


class RateLimited(RemoteError):
    """429 after the bounded retries; ``retry_after_s`` is what the server last asked for."""

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServerError(RemoteError):
    """A 5xx answer."""


class RequestRejected(RemoteError):
    """Another 4xx: the server refused the request as sent (its own message is kept)."""


class MalformedStream(RemoteError):
    """The server sent something that is not the OpenAI stream format."""


class TruncatedStream(RemoteError):
    """The connection closed before the stream's end (no finish_reason and no ``[DONE]``)."""


class StreamStalled(RemoteError):
    """Nothing arrived for longer than the endpoint's stall timeout."""
