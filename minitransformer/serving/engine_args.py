"""EngineArgs: how an Engine is sized and scheduled, with vLLM's names (its EngineArgs), checked once when built.

Like SamplingParams, each field says how it is offered to users (core.sampling_params.option: help, metavar, the
choices, which are their owner's own tuples), so `minitransformer serve` builds one flag per field from this class
(cli/options.add_options) and no default or choice is typed twice. `Engine(model, max_num_seqs=8)` builds one from
its keywords; `Engine(model, EngineArgs(...))` takes one whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..core.backend import check_count
from ..core.errors import InputError
from ..core.kv_storage import check_storage
from ..core.sampling_params import option
from .scheduler import POLICIES

# num_blocks=None: enough blocks for max_num_seqs full contexts, but no more than this many bytes of K and V
# (16 full 8192-token contexts of the default model would be 6 GiB).
DEFAULT_KV_CACHE_BYTES = 512 * 2**20
COUNTS = ("max_num_seqs", "block_size", "max_num_batched_tokens", "aging_steps", "kv_cache_bytes")


@dataclass(frozen=True)
class EngineArgs:
    """An Engine's sizes and policy. Each count is checked as a positive integer here, before it is multiplied into
    a byte count; what needs the model (max_model_len within its context, num_blocks from its KV bytes) is checked
    by the Engine."""
    max_num_seqs: int = field(default=16, metadata=option("most requests in the running batch (default {default})",
                                                          "N"))
    num_blocks: int | None = field(default=None, metadata=option(
        "KV cache blocks in the pool (default: enough for max-num-seqs contexts, up to --kv-cache-bytes)", "N"))
    block_size: int = field(default=16, metadata=option("tokens per KV block (default {default})", "N"))
    policy: str = field(default="continuous", metadata=option(
        "how the scheduler admits requests (default {default}; priority uses the requests' priority field, lower "
        "first)", choices=POLICIES))
    max_num_batched_tokens: int = field(default=512, metadata=option(
        "most tokens in one engine step (default {default}): a longer prompt is prefilled in chunks of what is left "
        "beside the running decodes (chunked prefill; lesson 16)", "N"))
    enable_prefix_caching: bool = field(default=True, metadata=option(
        "reuse the KV blocks of a prompt prefix another request already computed (default on)"))
    max_model_len: int | None = field(default=None, metadata=option(
        "most tokens (prompt + max_tokens) one request may use (default: the model's context)", "N"))
    aging_steps: int = field(default=32, metadata=option(
        "priority policy: a waiting request moves up one priority level per this many steps (default {default})",
        "N"))
    kv_cache_bytes: int = field(default=DEFAULT_KV_CACHE_BYTES, metadata=option(
        "without --num-blocks, the most bytes the KV pool may take (default 512 MiB)", "BYTES"))
    cuda_graphs: bool | None = field(default=None, metadata=option(
        "replay decode-only steps from CUDA graphs (default: on a GPU whose paged_decode kernel reads the pool)"))
    kv_cache: str = "f32"            # the pool's storage (core/kv_storage.py; --kv-cache, shared with generate)
    tenant_token_quota: int | dict | None = None   # tokens a tenant may hold in flight (serve's --api-keys file)

    def __post_init__(self):
        for name in COUNTS:
            object.__setattr__(self, name, check_count(name, getattr(self, name)))
        if self.num_blocks is not None:
            object.__setattr__(self, "num_blocks", check_count("num_blocks", self.num_blocks))
        if self.max_model_len is not None:
            object.__setattr__(self, "max_model_len", check_count("max_model_len", self.max_model_len))
        if self.policy not in POLICIES:
            raise InputError(f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        check_storage(self.kv_cache)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
