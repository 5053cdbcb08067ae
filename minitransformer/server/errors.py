"""HTTP errors as OpenAI's API returns them: a status code and `{"error": {"message", "type", "param", "code"}}`.

Clients (the `openai` package, curl scripts) branch on the status and read the message, so every refusal the server
makes is one of these, with a message that names the problem and the limit — never a traceback. The `type` values
are OpenAI's: "invalid_request_error" for anything the request itself got wrong (400, 401, 403, 404, 405, 413, 415),
"rate_limit_exceeded" for 429 (full queue, tenant over quota), "server_error" for our own faults (500, 503).
Starlette's own refusals (no such route, a method the route lacks) and any exception no route caught are turned into
the same object by `http_error` and `internal_error`, the app's exception handlers.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response


class APIError(Exception):
    """One refusal: raise it anywhere in a handler; the app turns it into the error object and status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        """OpenAI's error object: what the response carries, and what a stream's error event sends."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def json_type(value) -> str:
    """A JSON value's type as an error message names it ("an array", "null")."""
    return {type(None): "null", bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def too_many_requests(message: str, code: str, retry_after_s: int = 1) -> APIError:
    """429: the request was fine but cannot be taken now; Retry-After says when to try again."""
    return APIError(429, message, type="rate_limit_exceeded", code=code,
                    headers={"Retry-After": str(retry_after_s)})


class QueueFull(Exception):
    """The engine's waiting queue holds --max-waiting requests already (admission control: refuse, don't pile up)."""


class EngineFailed(Exception):
    """A step of the engine raised (a bug): its requests were ended and the server takes no new ones (503)."""


async def http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own refusals (no such route: 404, a method the route lacks: 405) as OpenAI's error object."""
    path = request.url.path
    if exc.status_code == 404:
        message = f"there is no {path} here; the API is under /v1 (GET /v1/models, POST /v1/completions, ...)"
        code = "not_found"
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        message = f"{request.method} is not allowed on {path}; it takes {allowed}"
        code = "method_not_allowed"
    else:
        message, code = exc.detail, None
    return APIError(exc.status_code, message, code=code, headers=dict(exc.headers or {})).response()


async def internal_error(request: Request, exc: Exception) -> Response:
    """An exception no route turned into a response: our bug (uvicorn logs it); the client gets the error object."""
    return APIError(500, "internal server error; the server log has the details", type="server_error").response()
