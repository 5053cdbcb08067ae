"""What every HTTP request meets before any route: the Host it names, whether the server still takes work, and which
other web origins may read its replies.

Host allow-list. A server on 127.0.0.1 is safe from the network but not from the browser on the same machine: a page
on evil.example can make its own name resolve to 127.0.0.1 a moment after it loaded (DNS rebinding), and from then on
its scripts call this server as their own origin and read the replies. What gives it away is the Host header, which
the browser fills with the page's name. So, as Ollama does, a request is served only if its Host (port aside) is a
name this server answers to: the address it was bound to, `localhost`, and whatever `--allowed-hosts` adds (`*`:
any, for a server behind a proxy that checks names itself), or an IP address (`127.0.0.1`, `[::1]`, a LAN address
of a server bound to 0.0.0.0): rebinding needs a name the attacker controls, and a page's scripts cannot choose the
Host header. Anything else is a 403. A request without a Host (HTTP/1.0) is not a browser's and passes.

Shutting down. While the server drains (app.py, `Server.drain`), every new request is a 503 with Connection: close.

Cross-origin reads (CORS). By default no response carries Access-Control-Allow-Origin, so a page on another origin
cannot read anything, and its preflight for a JSON POST fails (the routes allow no OPTIONS: 405). `--allowed-origins`
names the origins (`http://localhost:3000`, or `*`) whose pages may call the API: their preflight is answered and
their responses carry the header. A request a page can send without a preflight (a form, a `text/plain` fetch) is
refused by the JSON routes themselves: they take only `application/json` (app.py, 415).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response

from .errors import APIError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
CORS_MAX_AGE_S = 600            # how long a browser may reuse an answered preflight


@dataclass(frozen=True)
class AllowedHosts:
    """The names a request's Host may carry; `any_host` turns the check off."""
    names: frozenset[str]
    any_host: bool = False

    @classmethod
    def for_binding(cls, bound_host: str, extra: list[str] = ()) -> AllowedHosts:
        """The loopback names, the address the server was bound to, and --allowed-hosts."""
        extra = [host_name(h) for h in extra]
        names = frozenset([*LOOPBACK_NAMES, host_name(bound_host), *(h for h in extra if h != "*")])
        return cls(names, any_host="*" in extra)

    def allows(self, host: str | None) -> bool:
        if self.any_host or host is None:
            return True
        name = host_name(host)
        return name in self.names or _is_ip_address(name)


def _is_ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_name(host: str) -> str:
    """A Host header (or a --host value) as a bare lowercase name: '[::1]:8000' -> '::1', 'LocalHost.:80' ->
    'localhost' (a trailing dot names the same host)."""
    host = host.strip().lower()
    if host.startswith("["):                                     # an IPv6 literal, maybe with a port
        return host[1:host.find("]")] if "]" in host else host
    if host.count(":") == 1:                                     # name:port
        host = host.partition(":")[0]
    return host.rstrip(".")


class Guard:
    """ASGI middleware in front of the routes: the Host allow-list, 503 while draining, CORS for --allowed-origins.

    server: the app's Server (its `draining` flag); origins: the allowed origins ("*" for any).
    """

    def __init__(self, app, server, hosts: AllowedHosts, origins: frozenset[str] = frozenset()):
        self.app, self.server, self.hosts, self.origins = app, server, hosts, origins

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        refusal = self._refusal(headers)
        if refusal is not None:
            return await refusal.response()(scope, receive, send)
        origin = headers.get("origin")
        if origin is not None and ("*" in self.origins or origin in self.origins):
            if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
                return await Response(status_code=204, headers=preflight_headers(origin))(scope, receive, send)
            send = _with_cors(send, origin)
        await self.app(scope, receive, send)

    def _refusal(self, headers: Headers) -> APIError | None:
        host = headers.get("host")
        if not self.hosts.allows(host):
            return APIError(403, f"this server does not answer to the host name {host_name(host)!r} (Host header "
                                 f"{host!r}); if you reach it by that name, start it with --allowed-hosts "
                                 f"{host_name(host)}", code="host_not_allowed")
        if self.server.draining:
            return APIError(503, "the server is shutting down and takes no new requests", type="server_error",
                            code="server_shutting_down", headers={"Connection": "close"})
        return None


def preflight_headers(origin: str) -> dict[str, str]:
    """The answer to an allowed origin's preflight: it may POST JSON with a key, and GET."""
    return {"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Methods": "GET, POST",
            "Access-Control-Allow-Headers": "Authorization, Content-Type",
            "Access-Control-Max-Age": str(CORS_MAX_AGE_S), "Vary": "Origin"}


def _with_cors(send, origin: str):
    """`send`, adding Access-Control-Allow-Origin for `origin` to the response's headers."""
    async def send_with_cors(message):
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            headers["Access-Control-Allow-Origin"] = origin
            headers.add_vary_header("Origin")
        await send(message)
    return send_with_cors
