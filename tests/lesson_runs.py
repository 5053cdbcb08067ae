"""One run of a lesson at its small settings, shared by the tests that read it.

A lesson that starts servers takes most of a minute even with small settings. tests/test_transcripts.py runs every
lesson at its SMALL settings to compare the output's outline with the transcript, and a lesson's own test module
reads the same kind of run for its numbers: where both need the same run, this module makes it once per session.
The run carries a tag in its environment (every process it starts inherits it), and records which tagged
processes were still there a while after it ended.
"""

from __future__ import annotations

import functools
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import make_transcripts as mt
from test_tensor_parallel import tagged_processes

LEFTOVER_WAIT_S = 15


@dataclass(frozen=True)
class LessonRun:
    code: int
    output: str
    stderr: str
    figure: Path | None           # where the run drew its figure (when it was asked to)
    leftovers: tuple[int, ...]    # tagged processes still running LEFTOVER_WAIT_S after the lesson ended


def small_run(lesson: Path, args: tuple[str, ...], model_path: str, figure: bool = False) -> LessonRun:
    """Run `lesson` with `args` (piped, at make_transcripts' width) once per session."""
    return _run(lesson.resolve(), tuple(args), str(model_path), figure)


@functools.cache
def _run(lesson: Path, args: tuple[str, ...], model_path: str, figure: bool) -> LessonRun:
    tag = uuid.uuid4().hex
    path = Path(tempfile.mkdtemp(prefix="lesson-figure-")) / f"{lesson.stem}.png" if figure else None
    code, out, err, _ = mt.run(lesson, [*args, *(["--figure", str(path)] if path else [])], timeout=900,
                               env={"MINITRANSFORMER_MODEL": model_path, "MINITRANSFORMER_TEST_TAG": tag})
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    return LessonRun(code, out, err, path, tuple(tagged_processes(tag)))
