"""The build-it-yourself track: what an exercise is, how a learner's file is loaded, compared and plugged in.

An exercise is one function of the engine with its body taken out (exercises/NN_name.py, the file the learner
edits). `minitransformer learn check NAME` runs it in two stages:

  1. against the reference, which is the engine's own function (core/ or serving/, the code the project's tests
     check against HF and llama.cpp), on small random inputs shaped like the model's: exact or within a stated
     tolerance. A difference is reported where it is (which index, expected and got), and when the learner's output
     equals that of a classic mistake the exercise knows (ex*.py's MISTAKES), the mistake is named;
  2. inside the real model or engine: the learner's function is plugged in where the engine calls its own
     (`plugged`, or a protocol the engine takes, such as a runner or an attention backend) and the engine runs a
     real request: the same tokens as the reference, token for token, or frequencies within a stated bound.

Each exercise module (ex01_*.py ... in this folder) defines EXERCISE; `exercises()` finds them in order.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import pkgutil
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np

from ..core.errors import InputError

REPO_EXERCISES = Path(__file__).resolve().parents[2] / "exercises"   # the files the learner edits, in a clone


class CheckFailed(Exception):
    """A check found a difference: its message is the one paragraph the learner reads (no traceback)."""


@dataclass(frozen=True)
class Exercise:
    """One exercise: the function the learner writes and how it is checked.

    check(fn) raises CheckFailed, or returns the lines that say what ran (stage 2's run inside the engine).
    reference: the engine's own answer with the exercise's signature (the tests fill the exercise with it).
    """
    number: int
    name: str                   # what `learn check NAME` takes
    title: str
    function: str               # the function the learner writes in the file
    solution: str               # where the engine answers it: "minitransformer/core/layers.py: rms_norm"
    question: str               # the interview question it prepares
    lesson: str                 # the lesson that measures it
    hints: tuple[str, ...]
    check: Callable[[Callable], list[str]]
    reference: Callable
    mistakes: tuple[tuple[str, Callable], ...] = field(default=())

    @property
    def file_name(self) -> str:
        return f"{self.number:02d}_{self.name}.py"


@functools.cache
def exercises() -> tuple[Exercise, ...]:
    """Every exercise module's EXERCISE (ex01_*.py, ex02_*.py, ...), in reading order."""
    found = []
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name.startswith("ex") and info.name[2:4].isdigit():
            found.append(importlib.import_module(f"{__package__}.{info.name}").EXERCISE)
    return tuple(sorted(found, key=lambda e: e.number))


def find(name: str) -> Exercise:
    """The exercise called `name` (or numbered `name`), else one InputError that lists them."""
    for exercise in exercises():
        if name in (exercise.name, str(exercise.number), f"{exercise.number:02d}"):
            return exercise
    raise InputError(f"no exercise {name!r}; `minitransformer learn list` shows them: "
                     + ", ".join(e.name for e in exercises()))


def default_file(exercise: Exercise) -> Path:
    """The learner's file: exercises/NN_name.py of the clone this package runs from, else of the current folder."""
    for folder in (REPO_EXERCISES, Path.cwd() / "exercises"):
        if (folder / exercise.file_name).is_file():
            return folder / exercise.file_name
    raise InputError(f"no {exercise.file_name} in {REPO_EXERCISES} or ./exercises; run from a clone of the "
                     f"repository, or name your file with --file PATH")


def load_function(exercise: Exercise, path: Path) -> Callable:
    """Import the learner's file and return its function; a file that does not import is one CheckFailed naming the
    line, as the learner would see it in an editor."""
    if not path.is_file():
        raise InputError(f"no file {path}")
    spec = importlib.util.spec_from_file_location(f"learner_{exercise.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise CheckFailed(f"{path} does not import: {where(exc, path)}") from None
    fn = getattr(module, exercise.function, None)
    if not callable(fn):
        raise CheckFailed(f"{path} has no function {exercise.function}(); the exercise asks for it by that name")
    return fn


def run_check(exercise: Exercise, fn: Callable, path: Path | str = "your file") -> list[str]:
    """exercise.check(fn), with the learner's own exceptions turned into one readable CheckFailed."""
    try:
        return exercise.check(fn)
    except CheckFailed:
        raise
    except NotImplementedError:
        raise CheckFailed(f"{exercise.function}() is not written yet: its body still raises NotImplementedError. "
                          f"Write it in {path} (`minitransformer learn hint {exercise.name}` when stuck).") from None
    except Exception as exc:
        raise CheckFailed(f"{exercise.function}() raised {where(exc, path)}") from None


def where(exc: BaseException, path: Path | str) -> str:
    """'TypeError: ... (line 12: `return x / y`)': the exception and the learner's own line that raised it."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if str(path) in (f.filename, Path(f.filename).name)
              or f.filename == str(path)]
    line = getattr(exc, "lineno", None)
    text = f"{type(exc).__name__}: {exc}"
    if frames:
        return f"{text} (line {frames[-1].lineno}: `{(frames[-1].line or '').strip()}`)"
    return f"{text} (line {line})" if line else text


# ---------------------------------------------------------------------------------------------- comparing arrays

def compare(what: str, got, expected, inputs: Sequence = (), mistakes: Sequence[tuple[str, Callable]] = (),
            atol: float = 1e-5, rtol: float = 1e-4, axes: Sequence[str] = (), float32: bool = False) -> None:
    """Raise CheckFailed unless `got` equals `expected` within atol + rtol * |expected|: the shape first, then the
    worst element, named by `axes` ("batch", "head", ...), and the classic mistake whose output (mistake(*inputs))
    `got` equals, if any. float32: the result must also be float32 (a layer of the model's forward: a float64 one
    has the right values but turns every layer after it float64, several times slower)."""
    got_array = np.asarray(got)
    expected = np.asarray(expected)
    if got_array.shape != expected.shape:
        raise CheckFailed(f"{what}: expected shape {expected.shape}, got {got_array.shape}"
                          + likely_mistake(got_array, inputs, mistakes, atol, rtol))
    if got_array.dtype.kind not in "fiub":
        raise CheckFailed(f"{what}: expected numbers, got an array of {got_array.dtype}")
    error = np.abs(got_array.astype(np.float64) - expected) - rtol * np.abs(expected)
    bad = ~(error <= atol)                                            # NaN counts as bad
    if not bad.any():
        if float32 and got_array.dtype != np.float32:
            raise CheckFailed(f"{what} returns {got_array.dtype}, not float32: the model runs in float32, and a "
                              f"{got_array.dtype} result makes every layer after it {got_array.dtype} (several times "
                              f"slower). A NumPy float64 scalar such as np.sqrt(64) promotes float32 arrays: use a "
                              f"Python float (math.sqrt(64), 1 / 8)")
        return
    index = np.unravel_index(int(np.argmax(np.where(np.isnan(error), np.inf, error))), expected.shape)
    named = ", ".join(f"{a}={i}" for a, i in zip(axes, index)) if len(axes) == len(index) else \
        ", ".join(map(str, index))
    raise CheckFailed(f"{what} differs at [{named}]: expected {float(expected[index]):.6g}, got "
                      f"{float(got_array[index]):.6g} ({int(bad.sum())} of {bad.size} values off by more than "
                      f"{atol:g} + {rtol:g} x |expected|)" + likely_mistake(got_array, inputs, mistakes, atol, rtol))


def likely_mistake(got, inputs: Sequence, mistakes: Sequence[tuple[str, Callable]], atol: float, rtol: float) -> str:
    """'; likely mistake: ...' when `got` is what a known wrong solution gives on the same inputs."""
    for label, wrong in mistakes:
        try:
            theirs = np.asarray(wrong(*inputs))
        except Exception:
            continue
        if theirs.shape == got.shape and np.allclose(got, theirs, atol=atol, rtol=rtol, equal_nan=True):
            return f". Likely mistake: {label}"
    return ""


def same_tokens(what: str, got: Sequence[int], expected: Sequence[int], decode: Callable[[list[int]], str]) -> None:
    """Raise CheckFailed at the first token that differs, with both texts up to there."""
    got, expected = list(got), list(expected)
    if got == expected:
        return
    first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    raise CheckFailed(f"{what}: the tokens differ from token {first} on: expected {decode(expected[first:first + 8])!r}"
                      f" (ids {expected[first:first + 8]}), got {decode(got[first:first + 8])!r} (ids "
                      f"{got[first:first + 8]}); the same text up to there: {decode(expected[:first])!r}")


# ------------------------------------------------------------------------------------- the real model, plugged

@functools.cache
def real_model():
    """The default model, loaded once per process: it must be on disk already (the track runs offline)."""
    from .. import load_model
    from ..models import resolve_model_path
    try:
        path = resolve_model_path(None, fetch=False)
    except Exception as exc:
        raise CheckFailed(f"stage 2 runs the real model, which is not here: {exc}") from None
    return load_model(path)


@contextlib.contextmanager
def plugged(owner: ModuleType | type, name: str, fn: Callable) -> Iterator[None]:
    """Replace `owner.name` (a module's function, or a class's method) by the learner's function for the duration:
    the engine then calls it where it calls its own (the attribute is what its code looks up on every call)."""
    own = getattr(owner, name)
    setattr(owner, name, fn)
    try:
        yield
    finally:
        setattr(owner, name, own)


def greedy_ids(prompt: str, max_tokens: int, model=None, **options) -> list[int]:
    """The real model's greedy continuation of `prompt` (ignore_eos: always max_tokens ids)."""
    from ..core.generate import generate
    from ..core.sampling_params import SamplingParams
    model = model if model is not None else real_model()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return list(generate(model, prompt, params, **options).token_ids)


@functools.cache
def reference_ids(prompt: str, max_tokens: int) -> tuple[int, ...]:
    """greedy_ids with the engine's own functions, once per process: a check calls it outside its plugged() block,
    so what it remembers is the reference's answer, never a learner's."""
    return tuple(greedy_ids(prompt, max_tokens))


def random_inputs(seed: int, *shapes: tuple[int, ...], scale: float = 1.0) -> list[np.ndarray]:
    """float32 arrays of standard normals (times scale), one per shape, from one seeded generator."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) * scale).astype(np.float32) for shape in shapes]
