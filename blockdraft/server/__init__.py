"""`blockdraft serve`: an OpenAI-compatible HTTP server over the batched speculative decode loop.

schema.py (requests, responses, errors), worker.py (the thread that owns the model and batches requests),
warmup.py (step costs measured after startup), responses.py (a request's tokens -> text -> whole or streamed
answer), stops.py (stop strings), prometheus.py (metrics), app.py (routes, limits, errors -> HTTP codes),
shutdown.py (uvicorn with a draining SIGTERM). Needs the `serve` extra.
"""

from .app import create_app

__all__ = ["create_app"]
