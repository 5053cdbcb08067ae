"""The build-it-yourself track's frame and command (`minitransformer learn`): every exercise is complete and fails
clearly when untouched; a check reads a learner's file the way an editor shows it; list, hint and solution answer.
Each exercise's reference pass and planted mistakes are tested beside its group (test_learn_model.py,
test_learn_loop.py, test_learn_serving.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from minitransformer.cli import main
from minitransformer.learn import track

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = track.exercises()


@pytest.fixture(autouse=True)
def own_progress(tmp_path, monkeypatch):
    """Progress and hints are remembered in the cache folder: a fresh one per test (the model is looked up by its
    own path, so the default model must stay findable: MINITRANSFORMER_HOME is not touched, only learn's file)."""
    monkeypatch.setattr("minitransformer.cli.learn.cache_dir", lambda: tmp_path / "cache")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["learn", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_track_has_at_least_twelve_exercises_in_reading_order_each_complete():
    assert len(EXERCISES) >= 12
    assert [e.number for e in EXERCISES] == list(range(1, len(EXERCISES) + 1))
    assert len({e.name for e in EXERCISES}) == len(EXERCISES)
    for exercise in EXERCISES:
        source = (ROOT / "exercises" / exercise.file_name).read_text()
        tree = ast.parse(source)
        assert len(ast.get_docstring(tree) or "") > 200, f"{exercise.file_name}: the idea, shapes and pitfalls"
        functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)}
        assert exercise.function in functions, exercise.file_name
        assert len(exercise.hints) >= 2 and exercise.question.endswith(("?", ".")), exercise.name
        solution_file = exercise.solution.split(":")[0]
        assert (ROOT / solution_file).is_file(), f"{exercise.name}: the solution names {solution_file}"
        lesson_files = [word.strip("(),;").split("#")[0] for word in exercise.lesson.split() if "/" in word]
        assert lesson_files and all((ROOT / f).exists() for f in lesson_files), (exercise.name, lesson_files)


def test_the_tracks_readme_lists_every_exercise_and_the_front_pages_name_the_track():
    readme = (ROOT / "exercises" / "README.md").read_text()
    for exercise in EXERCISES:
        assert f"| {exercise.number:02d} | [`{exercise.name}`]({exercise.file_name}) | {exercise.title} | " \
               f"`{exercise.function}` |" in readme, exercise.name
    assert "exercises/README.md" in (ROOT / "README.md").read_text()
    assert "../exercises/README.md" in (ROOT / "lessons" / "README.md").read_text()


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.name for e in EXERCISES])
def test_an_untouched_exercise_fails_its_check_naming_what_is_missing(exercise, capsys, real_model_path):
    code, out, err = run(capsys, "check", exercise.name)
    assert code == 1, out + err
    assert out.startswith(f"FAIL {exercise.name}: ") and "not written yet" in out, out
    assert "Traceback" not in out + err
    assert out.count("\n") == 1, "one paragraph"


def test_a_filled_exercise_passes_and_list_shows_it_until_the_file_changes(capsys, tmp_path, real_model_path):
    mine = tmp_path / "02_rms_norm.py"
    mine.write_text("import numpy as np\n\n\ndef rms_norm(x, weight, eps):\n"
                    "    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight\n")
    code, out, _ = run(capsys, "check", "rms_norm", "--file", str(mine))
    assert code == 0, out
    assert "ran inside the real model" in out and "the reference's 12 tokens, token for token" in out
    assert out.strip().splitlines()[-1].startswith("PASS rms_norm. It prepares: ")
    # `list` looks at the clone's exercises/ folder; point the exercise at this file to see its progress
    original = track.default_file
    track.default_file = lambda exercise: mine if exercise.name == "rms_norm" else original(exercise)
    try:
        code, out, _ = run(capsys, "list")
        row = next(line for line in out.splitlines() if line.startswith("02  rms_norm"))
        assert code == 0 and row.endswith("passed")
        assert f"1 of {len(EXERCISES)} passed" in out
        mine.write_text(mine.read_text() + "# an edit\n")
        _, out, _ = run(capsys, "list")
        assert next(line for line in out.splitlines() if line.startswith("02  rms_norm")).endswith(
            "changed since it passed")
    finally:
        track.default_file = original


@pytest.mark.parametrize("source, expected", [
    ("def rms_norm(x, weight, eps)\n    return x\n", "does not import: SyntaxError"),
    ("import numpy as np\n\ndef rms_norm(x, weight, eps):\n    return np.sqrt(x, weight, eps, 1, 2)\n",
     "rms_norm() raised TypeError"),
    ("def rmsnorm(x, weight, eps):\n    return x\n", "has no function rms_norm()"),
])
def test_a_broken_file_is_one_line_naming_the_problem_and_its_line(source, expected, capsys, tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text(source)
    code, out, err = run(capsys, "check", "rms_norm", "--file", str(mine))
    assert code == 1 and expected in out and "Traceback" not in out + err, out
    if "TypeError" in expected:
        assert "(line 4: `return np.sqrt(x, weight, eps, 1, 2)`)" in out


def test_a_check_that_never_ends_fails_at_its_time_limit(capsys, tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text("def rms_norm(x, weight, eps):\n    while True:\n        pass\n")
    code, out, err = run(capsys, "check", "rms_norm", "--file", str(mine), "--time-limit", "1")
    assert code == 1 and "Traceback" not in out + err
    assert out.strip() == ("FAIL rms_norm: the check did not finish within 1 s (--time-limit); a loop in rms_norm() "
                           "that never ends is the likely cause")
    code, _, err = run(capsys, "check", "rms_norm", "--file", str(mine), "--time-limit", "0")
    assert code == 2 and "--time-limit must be > 0 seconds, got 0" in err


def test_bad_input_is_exit_code_2_with_one_line(capsys, tmp_path):
    code, _, err = run(capsys, "check", "flash_attention")
    assert code == 2 and "no exercise 'flash_attention'" in err and "rms_norm" in err
    code, _, err = run(capsys, "check", "rms_norm", "--file", str(tmp_path / "missing.py"))
    assert code == 2 and f"no file {tmp_path / 'missing.py'}" in err


def test_hints_come_one_at_a_time_and_solution_points_at_the_engine(capsys):
    exercise = track.find("rms_norm")
    _, first, _ = run(capsys, "hint", "rms_norm")
    _, second, _ = run(capsys, "hint", "2")                        # by number too
    assert first.splitlines() == [f"hint 1 of {len(exercise.hints)}: {exercise.hints[0]}"]
    assert second.splitlines()[1] == f"hint 2 of {len(exercise.hints)}: {exercise.hints[1]}"
    _, every, _ = run(capsys, "hint", "rms_norm", "--all")
    assert len(every.splitlines()) == len(exercise.hints)
    code, out, _ = run(capsys, "solution", "rms_norm")
    assert code == 0 and "minitransformer/core/layers.py: rms_norm" in out and exercise.question in out


def test_the_compare_message_names_the_worst_index_and_a_matching_mistake():
    import numpy as np
    expected = np.zeros((2, 3), np.float32)
    got = expected.copy()
    got[1, 2] = 0.5
    with pytest.raises(track.CheckFailed) as failed:
        track.compare("f(x)", got, expected, (expected,), [("it adds a half at the end", lambda x: got)],
                      axes=("row", "col"))
    message = str(failed.value)
    assert "f(x) differs at [row=1, col=2]: expected 0, got 0.5 (1 of 6 values off" in message
    assert message.endswith("Likely mistake: it adds a half at the end")
    with pytest.raises(track.CheckFailed, match=r"expected shape \(2, 3\), got \(3, 2\)"):
        track.compare("f(x)", got.T, expected)
