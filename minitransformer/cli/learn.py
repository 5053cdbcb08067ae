"""`minitransformer learn list | check NAME [--file PATH] | hint NAME | solution NAME`: the build-it-yourself track.

The exercises are exercises/NN_name.py (the learner edits them); learn/track.py checks them and plugs them in.
`check` exits 0 when the exercise passes, 1 when it does not (one paragraph saying what differs), 2 on bad input
(an unknown exercise, a missing file). A pass is remembered by the file's content hash, so `list` shows progress
without running anything, and an edit after a pass shows as "changed since it passed".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from ..core.errors import InputError
from ..models import cache_dir

PROGRESS_FILE = "learn-progress.json"            # in the model cache folder: {absolute file path: sha256 that passed}
TIME_LIMIT_S = 300.0                             # a check takes well under a minute; five is a loop that never ends


class TimeLimit(BaseException):
    """Raised into the check by SIGALRM: a BaseException, so no `except Exception` on the way (the learner's or the
    engine's) can swallow it."""


def add_learn_parser(commands) -> None:
    learn = commands.add_parser("learn", help="the build-it-yourself track: write the engine's functions yourself "
                                              "and run them inside it (exercises/)")
    actions = learn.add_subparsers(dest="action", required=True, parser_class=type(learn))
    actions.add_parser("list", help="the exercises in order, and which of yours pass")
    check = actions.add_parser("check", help="check your exercise against the engine, then run it inside the engine")
    check.add_argument("name", help="the exercise (its name or number, from `learn list`)")
    check.add_argument("--file", metavar="PATH", help="your file (default: exercises/NN_name.py of this clone)")
    check.add_argument("--time-limit", type=float, default=TIME_LIMIT_S, metavar="SEC",
                       help=f"fail a check that runs longer, e.g. a loop that never ends (default {TIME_LIMIT_S:g})")
    for action, help_text in (("hint", "the next hint for an exercise (all of them with --all)"),
                              ("solution", "where the engine answers an exercise (file and function)")):
        sub = actions.add_parser(action, help=help_text)
        sub.add_argument("name", help="the exercise (its name or number)")
        if action == "hint":
            sub.add_argument("--all", action="store_true", help="every hint at once")


def cmd_learn(args) -> int:
    from ..learn import track
    if args.action == "list":
        return _list(track)
    exercise = track.find(args.name)
    if args.action == "hint":
        return _hint(exercise, args.all)
    if args.action == "solution":
        print(f"{exercise.number:02d} {exercise.title}: {exercise.solution}")
        print(f"  the interview question it prepares: {exercise.question}")
        print(f"  measured in: {exercise.lesson}")
        return 0
    path = Path(args.file) if args.file else track.default_file(exercise)
    if not args.time_limit > 0:
        raise InputError(f"--time-limit must be > 0 seconds, got {args.time_limit:g}")
    print(f"checking {exercise.number:02d} {exercise.title} in {path} ...", file=sys.stderr)
    try:
        with time_limit(args.time_limit):
            lines = track.run_check(exercise, track.load_function(exercise, path), path)
    except (track.CheckFailed, TimeLimit) as failed:
        message = str(failed) if isinstance(failed, track.CheckFailed) else \
            (f"the check did not finish within {args.time_limit:g} s (--time-limit); a loop in "
             f"{exercise.function}() that never ends is the likely cause")
        print(f"FAIL {exercise.name}: {message}")
        _remember(path, passed=False)
        return 1
    for line in lines:
        print(line)
    print(f"PASS {exercise.name}. It prepares: {exercise.question}")
    _remember(path, passed=True)
    return 0


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise TimeLimit in this (the main) thread after `seconds`, where the platform has SIGALRM; else no limit."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum, frame):
        raise TimeLimit()

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _list(track) -> int:
    progress = _progress()
    done = 0
    for exercise in track.exercises():
        try:
            path = track.default_file(exercise)
        except Exception:
            path = None
        state = "not checked yet"
        if path is not None and str(path.resolve()) in progress:
            passed = progress[str(path.resolve())] == _digest(path)
            state = "passed" if passed else "changed since it passed"
            done += passed
        print(f"{exercise.number:02d}  {exercise.name:<20} {exercise.title:<46} {state}")
    print(f"{done} of {len(track.exercises())} passed; `minitransformer learn check NAME` checks one")
    return 0


def _hint(exercise, every: bool) -> int:
    """Hints one at a time: each call shows one more (remembered like progress), --all shows them all."""
    progress = _progress()
    key = f"hint:{exercise.name}"
    shown = len(exercise.hints) if every else min(int(progress.get(key, 0)) + 1, len(exercise.hints))
    for i, hint in enumerate(exercise.hints[:shown], 1):
        print(f"hint {i} of {len(exercise.hints)}: {hint}")
    if not every:
        progress[key] = shown
        _save(progress)
    return 0


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _progress() -> dict:
    try:
        return json.loads((cache_dir() / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _save(progress: dict) -> None:
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        (cache_dir() / PROGRESS_FILE).write_text(json.dumps(progress, indent=1))
    except OSError:
        pass                                     # progress is a convenience; the check's verdict was printed


def _remember(path: Path, passed: bool) -> None:
    progress = _progress()
    key = str(path.resolve())
    if passed:
        progress[key] = _digest(path)
    else:
        progress.pop(key, None)
    _save(progress)
