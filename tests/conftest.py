"""Shared fixtures: the tiny random-weight GGUF model (fast unit tests), the real default model, and our server on
the tiny model (the bench tests measure it over HTTP)."""

from __future__ import annotations

import os
from unittest import mock

import pytest

import tiny_model as tiny
from tiny_model import write_tiny_llama

# Checked mode (minitransformer/kernels/checked.py): every paged-decode launch has its block tables and lengths
# read on the host first, so on a GPU a bad block id fails its own test with the entry named instead of killing
# the CUDA context for every test after it. Set here, before any test runs, so subprocesses inherit it too.
os.environ.setdefault("MINITRANSFORMER_CHECKED", "1")


def pytest_collection_modifyitems(items):
    """Mark every test that needs a real model `real_model`, so `python -m pytest -m "not real_model"` is a fast loop
    on the tiny model alone. A test needs one when it asks for the real_model_path fixture (real_model and
    real_tokenizer ask for it) or gemma_model_path; a test that runs a lesson, a notebook or the CLI on the default
    model carries the mark itself (pytestmark)."""
    for item in items:
        if {"real_model_path", "gemma_model_path"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.real_model)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A tiny llama GGUF (F32, Q8_0 and Q4_1 tensors) written once per test session."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def tiny_model(tiny_model_path):
    from minitransformer import load_model
    return load_model(tiny_model_path)


@pytest.fixture(scope="session")
def kernel_sized_path(tmp_path_factory):
    """The tiny model with head_dim 64 (a compiled kernel size): 2 query heads sharing 1 KV head, 2 layers."""
    dims = {**tiny.DIMS, "d_model": 128, "n_heads": 2, "n_kv_heads": 1, "head_dim": 64}
    with mock.patch.object(tiny, "DIMS", dims):
        return write_tiny_llama(tmp_path_factory.mktemp("hd64") / "tiny-hd64.gguf")


@pytest.fixture(scope="session")
def real_model_path():
    """The default SmolLM2-135M-Instruct GGUF (fetched on first use, as a user would get it)."""
    from minitransformer.models import resolve_model_path
    return resolve_model_path(None)


@pytest.fixture(scope="session")
def gemma_model_path():
    """The Gemma 3 270M GGUF (`--model gemma3-270m`), fetched on first use like the default model. Where it cannot be
    fetched (no network) the test is skipped with the reason, except under CI (CI=true), which can fetch it: there
    the error fails the test rather than hide it."""
    from minitransformer.core.errors import ModelFetchError
    from minitransformer.models import resolve_model_path
    try:
        return resolve_model_path("gemma3-270m")
    except ModelFetchError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"Gemma 3 270M is not on disk and could not be fetched: {exc}")


@pytest.fixture(scope="session")
def real_model(real_model_path):
    from minitransformer import load_model
    return load_model(real_model_path)


@pytest.fixture(scope="session")
def real_tokenizer(real_model):
    return real_model.tokenizer


@pytest.fixture(scope="module")
def our_server(tiny_model_path, tmp_path_factory):
    """Our `minitransformer serve` on the tiny model, 4 slots, on a free loopback port; stopped after the module."""
    from minitransformer.bench.managed_server import ManagedServer, free_port
    from minitransformer.bench.serve_compare import ours_argv
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    with ManagedServer("ours", ours_argv(str(tiny_model_path), port, 4), port, "/health", log,
                       ready_timeout_s=120) as server:
        yield server
