"""A learner's file for the build-it-yourself track's tests: written to a test folder and loaded as `minitransformer
learn check` loads it, then checked, expecting the one-paragraph failure a learner would read."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from minitransformer.learn import track


def learner_file(tmp_path: Path, name: str, source: str, prelude: str = ""):
    """(exercise, the learner's function, its file) for a file holding `source` (dedented, after `prelude`)."""
    exercise = track.find(name)
    path = tmp_path / exercise.file_name
    path.write_text(prelude + textwrap.dedent(source))
    return exercise, track.load_function(exercise, path), path


def check_fails(exercise, fn, path: Path | str = "your file", *fragments: str) -> str:
    """The check's failure message, which must contain every fragment."""
    with pytest.raises(track.CheckFailed) as failed:
        track.run_check(exercise, fn, path)
    message = str(failed.value)
    for fragment in fragments:
        assert fragment in message, message
    return message
