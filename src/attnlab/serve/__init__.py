"""The OpenAI-compatible HTTP server of `attnlab serve` (FastAPI + uvicorn, the optional `serve` extra).

    app.py         the routes (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models,
                   /health, /metrics, the chat page at /), body limit, API key, SSE
    schemas.py     request validation (OpenAI's fields; a bad one is a 400 naming it)
    errors.py      OpenAI-style error objects and their statuses
    generation.py  a request's prompt ids, limits, and its tokens streamed back as text
    scheduler.py   continuous batching: one loop owns the decode engine (engines/)
    responses.py   OpenAI's response and chunk objects, server-sent events
    metrics.py     Prometheus counters, gauges and histograms
    server.py      loading, uvicorn on a bound socket, the drain on SIGTERM
    chat.html      the chat page (one self-contained file: inline script and style)
"""
