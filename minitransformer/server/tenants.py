"""API keys: who is calling, how many tokens they may hold in flight, and how urgent their requests are.

`--api-keys FILE` is a JSON object mapping each key to its tenant:

    {"sk-alice-123": {"tenant": "alice", "quota_tokens": 8192, "priority": 0},
     "sk-batch-456": {"tenant": "batch-jobs", "quota_tokens": 2048, "priority": 10}}

Clients send the key as OpenAI clients do (`Authorization: Bearer sk-alice-123`). quota_tokens (optional) bounds the
tokens a tenant's unfinished requests may reserve together (prompt + max_tokens each): the Engine's admission
control, so one tenant cannot fill the KV cache and starve the others. A request that would go over it while the
tenant's other requests hold their tokens is a 429 (retry later); one larger than the whole quota is a 400 (it could
never run), and a chat request without max_tokens gets what the quota leaves. priority
(optional, default 0; lower runs first under `--policy priority`) is the default of a request that sets none.
Several keys may name the same tenant; they share its quota.

Tenants are kept apart. The prefix cache is salted per tenant (vLLM's cache_salt): a tenant's requests reuse only the
cached prompt blocks its own requests left, because a cache hit shows (in /metrics and in the time to first token)
and would let one tenant test guesses of another's prompts. Tenants that trust each other and share a long system
prompt can share the cache explicitly by giving the same "cache_salt" (optional, default: the tenant's own name):

    {"sk-a": {"tenant": "team-a", "cache_salt": "docs"}, "sk-b": {"tenant": "team-b", "cache_salt": "docs"}}

The live page's event stream shows a tenant's key only its own requests (the others as anonymous occupancy), and
/metrics answers only to a key (or to --metrics-key alone, the operator's key, which also sees every request).
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request

from ..core.backend import is_int
from ..core.errors import InputError
from .errors import APIError


@dataclass(frozen=True)
class Tenant:
    name: str
    quota_tokens: int | None = None
    priority: int = 0
    cache_salt: str | None = None               # None: the tenant's name (its own prefix cache)

    @property
    def salt(self) -> str:
        """The prefix-cache salt of this tenant's requests."""
        return "tenant:" + self.name if self.cache_salt is None else "shared:" + self.cache_salt


def load_api_keys(path: str | Path) -> dict[str, Tenant]:
    """The keys file -> {key: Tenant}; InputError (one line, naming the key and field) when it is malformed."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read the API keys file {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"the API keys file {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise InputError(f"the API keys file {path} must be a JSON object mapping each key to "
                         '{"tenant": NAME, "quota_tokens": N, "priority": P}')
    keys: dict[str, Tenant] = {}
    quotas: dict[str, int | None] = {}
    salts: dict[str, str | None] = {}
    for key, entry in data.items():
        where = f"API keys file {path}, key {key[:4]}...:"
        if not key.strip() or key != key.strip():
            raise InputError(f"{where} a key must be non-empty and have no surrounding spaces")
        if not isinstance(entry, dict) or not isinstance(entry.get("tenant"), str) or not entry["tenant"]:
            raise InputError(f'{where} give an object with a non-empty "tenant" name')
        quota, priority, salt = entry.get("quota_tokens"), entry.get("priority", 0), entry.get("cache_salt")
        if quota is not None and (not is_int(quota) or quota < 1):
            raise InputError(f"{where} quota_tokens must be a positive integer, got {quota!r}")
        if not is_int(priority):
            raise InputError(f"{where} priority must be an integer, got {priority!r}")
        if salt is not None and (not isinstance(salt, str) or not salt):
            raise InputError(f"{where} cache_salt must be a non-empty string (tenants that give the same one share "
                             f"their prefix cache), got {salt!r}")
        name = entry["tenant"]
        if name in quotas and quotas[name] != quota:
            raise InputError(f"{where} tenant {name!r} is given two different quotas ({quotas[name]} and {quota})")
        if name in salts and salts[name] != salt:
            raise InputError(f"{where} tenant {name!r} is given two different cache_salt values")
        quotas[name], salts[name] = quota, salt
        keys[key] = Tenant(name, quota, priority, salt)
    return keys


def tenant_quotas(keys: dict[str, Tenant]) -> dict[str, int] | None:
    """{tenant: quota} for Engine(tenant_token_quota=...), or None when no tenant has one."""
    quotas = {t.name: t.quota_tokens for t in keys.values() if t.quota_tokens is not None}
    return quotas or None


class Access:
    """Who is asking, from the request's key: a tenant of --api-keys, the operator (--metrics-key), or anyone when the
    server has neither. Each rule below is the one place its page asks."""

    def __init__(self, api_keys: dict[str, Tenant] | None, metrics_key: str | None):
        self.api_keys, self.metrics_key = api_keys, metrics_key

    def tenant(self, request: Request) -> Tenant | None:
        """The generation routes: the key's tenant (401 without a valid key), or None when the server has no keys."""
        return None if self.api_keys is None else tenant_of_key(request, self.api_keys)

    def operator_only(self, request: Request) -> None:
        """The operator's pages (/metrics, /v1/loads, /server_info): with --metrics-key only that key reads them;
        else with --api-keys any key does; else anyone."""
        if self.metrics_key is not None:
            if not self.is_operator(request):
                raise APIError(401, f"{request.url.path} needs the metrics key (--metrics-key): send "
                                    "'Authorization: Bearer METRICS_KEY'", code="invalid_api_key")
        else:
            self.tenant(request)

    def viewer(self, request: Request) -> str | None:
        """Whose requests /v1/engine/events may show in detail: None for every tenant's (no keys, or the metrics
        key), else the name of the key's tenant (401 without a valid key)."""
        if self.is_operator(request):
            return None
        if self.api_keys is None:
            if self.metrics_key is not None:
                raise APIError(401, "the engine's events need the metrics key (--metrics-key)",
                               code="invalid_api_key")
            return None
        return tenant_of_key(request, self.api_keys).name

    def is_operator(self, request: Request) -> bool:
        key, expected = bearer(request), self.metrics_key
        return expected is not None and key is not None and hmac.compare_digest(key.encode(), expected.encode())


def tenant_of_key(request: Request, keys: dict[str, Tenant]) -> Tenant:
    """The tenant of the request's API key, or the 401 of a missing or unknown key."""
    key = bearer(request)
    if key is None:
        raise APIError(401, "missing API key: send the header 'Authorization: Bearer YOUR_KEY'",
                       code="invalid_api_key")
    tenant = keys.get(key)
    if tenant is None:
        raise APIError(401, "invalid API key", code="invalid_api_key")
    return tenant


def bearer(request: Request) -> str | None:
    """The key of an 'Authorization: Bearer KEY' header, or None."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None
