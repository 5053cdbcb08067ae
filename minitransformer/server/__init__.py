"""An OpenAI-compatible HTTP server over the serving engine: `minitransformer serve` (lesson 14 measures it).

One concept per file, in the order a request meets them:
connections.py (a request head in time, a cap on connections) -> guard.py (the Host allow-list, CORS, 503 while
shutting down) -> errors.py (OpenAI's error objects) -> tenants.py (API keys, quotas, tenants kept apart)
-> protocol.py (request bodies, checked and capped) -> engine_loop.py (the one thread that steps the Engine; handlers
talk to it through queues) -> responses.py (whole responses and server-sent-event chunks) -> prometheus.py
(/metrics) -> router_info.py (what a router in front of replicas reads: load, settings, version) -> app.py (the
routes) -> runner.py (uvicorn, and a graceful end on SIGTERM or Ctrl-C).
"""

from .app import Server, ServerConfig
from .engine_loop import EngineLoop
from .prometheus import ServerMetrics

__all__ = ["Server", "ServerConfig", "EngineLoop", "ServerMetrics"]
