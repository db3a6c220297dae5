"""The local API server: OpenAI- and Anthropic-compatible endpoints over the engine's one scheduler.

Modules, one job each: ``openai_schemas`` (request and response models of the OpenAI API), ``errors`` (each API's
error object), ``sse`` (server-sent-event encoding), ``host`` (the served model and the thread that runs its
scheduler), ``openai_routes`` (the OpenAI endpoints), ``app`` (the ASGI application: routes, auth, limits,
health, metrics) and ``cli`` (``hearth serve``). Nothing here imports Qt or ``app/``.
"""
