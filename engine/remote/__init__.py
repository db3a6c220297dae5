"""Remote engines: a model served over OpenAI-compatible HTTP (vLLM, llama.cpp's llama-server, Ollama, another
Hearth) used like a local one — its client, typed errors, and a model object whose scheduler streams from the wire."""

from .client import Capabilities, RemoteClient, StreamChunk
from .endpoint import Endpoint
from .errors import (AuthenticationFailed, EndpointUnreachable, MalformedStream, ModelNotFound, RateLimited,
                     RemoteError, RequestRejected, ServerError, StreamStalled, TruncatedStream)
from .model import RemoteModel, RemoteScheduler, RemoteStats, is_remote_ref, parse_remote_ref, remote_ref

__all__ = ["AuthenticationFailed", "Capabilities", "Endpoint", "EndpointUnreachable", "MalformedStream",
           "ModelNotFound", "RateLimited", "RemoteClient", "RemoteError", "RemoteModel", "RemoteScheduler",
           "RemoteStats", "RequestRejected", "ServerError", "StreamChunk", "StreamStalled", "TruncatedStream",
           "is_remote_ref", "parse_remote_ref", "remote_ref"]
