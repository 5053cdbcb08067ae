"""The errors a user can cause, each carrying one line that names the problem and the limit.

The CLI prints `str(error)` on stderr and exits with code 2; nothing else in the library prints.
Anything that is not one of these is a bug in minitransformer and keeps its traceback.
"""


class MiniTransformerError(Exception):
    """Base class: bad input or an unusable environment, never a bug."""


class ModelFileError(MiniTransformerError):
    """The model file is missing, not a GGUF, truncated, or of an architecture / quantization we do not run."""


class ModelFetchError(MiniTransformerError):
    """The default model is not on disk and could not be obtained (no network, checksum mismatch, ...)."""


class InputError(MiniTransformerError):
    """A prompt, token id or setting is out of range (e.g. longer than the context). `param` names the request's
    field at fault where one is ("prompt", "max_tokens", "stop_token_ids"): the server's 400 carries it."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class QuotaError(InputError):
    """A tenant's requests in flight would hold more tokens than its quota (the server answers 429, not 400)."""


class MemoryLimitError(InputError):
    """A reservation (KV cache, RoPE table, CUDA graph buffers) larger than the memory left: refused before any of
    it is allocated, with the bytes asked and available (backend.check_memory)."""


class DeviceError(MiniTransformerError):
    """The requested device is not available (e.g. --device gpu with no GPU or no CuPy)."""
