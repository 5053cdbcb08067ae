"""docs/interview.md holds up: every self-test question (Z1-Z6), follow-up (Q1-Q3, Q5-Q7), common mistake (M1-M5) and
table (T1-T4) is answered with a “quote” of a committed transcript and a link to the lesson that shows it; every
quote is in a transcript its paragraph links; at least 12 predict-then-run exercises over at least 8 lessons, whose
worked solutions (the >>> lines) run as doctests on the project's own functions; every relative link resolves.
"""

from __future__ import annotations

import doctest
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import make_transcripts as mt
from test_transcripts import AWAITING

# Transcripts of lessons merged before their first quiet run (test_transcripts.AWAITING): a quote of one, or a link
# to it, is checked once `python scripts/make_transcripts.py --only NN` has written it.
PENDING = {mt.transcript_for(p).resolve() for p in mt.lessons() if p.stem[:2] in AWAITING}

DOC = ROOT / "docs" / "interview.md"
ITEMS = [f"Z{i}" for i in range(1, 7)] + [f"Q{i}" for i in (1, 2, 3, 5, 6, 7)] + [f"M{i}" for i in range(1, 6)] \
    + [f"T{i}" for i in range(1, 5)]
LESSON_LINK = re.compile(r"\]\(\.\./lessons/(\d\d)_\w+\.py\)")
TRANSCRIPT_LINK = re.compile(r"\]\(\.\./lessons/transcripts/(\d\d)_\w+\.md\)")


def sections(text: str) -> dict[str, str]:
    """'### Z1 What does ...' -> {'Z1': the text up to the next heading of level 1-3}."""
    parts = re.split(r"^(#{1,3} .*)$", text, flags=re.M)
    found = {}
    for heading, body in zip(parts[1::2], parts[2::2]):
        if m := re.match(r"### ([A-Z]\d+)\b", heading):
            found[m.group(1)] = heading + body
    return found


def test_every_question_mistake_and_table_is_answered_with_a_quote_and_its_lesson():
    found = sections(DOC.read_text())
    missing = [item for item in ITEMS if item not in found]
    assert not missing, f"not answered in docs/interview.md: {missing}"
    for item in ITEMS:
        body = found[item]
        assert mt.QUOTE.search(body), f"{item} quotes no transcript"
        lessons, transcripts = set(LESSON_LINK.findall(body)), set(TRANSCRIPT_LINK.findall(body))
        assert lessons and transcripts, f"{item} links no lesson or no transcript"
        assert transcripts <= lessons, f"{item}: a transcript is linked without its lesson"


def test_every_quote_appears_in_a_transcript_its_paragraph_links():
    found = mt.quotes(DOC)
    assert len(found) >= 40
    for quote, sources in found:
        assert sources, f"“{quote}” is in a paragraph that links no transcript"
        if set(sources) <= PENDING and not any(s.is_file() for s in sources):
            continue                                       # its lesson's first transcript is still to be made
        texts = [mt.flat(mt.read(s)[1]) for s in sources]
        assert any(quote in t for t in texts), \
            f"“{quote}” is not in {[s.name for s in sources]}: python scripts/make_transcripts.py refreshes numbers"


def test_every_relative_link_resolves_to_a_file_in_the_repository_or_a_heading():
    text = DOC.read_text()
    # a heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces -> hyphens
    anchors = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}
    links = [link for link in mt.LINK.findall(text) if not re.match(r"[a-z]+:", link)]
    assert len(links) >= 40
    for link in links:
        if link.startswith("#"):
            assert link[1:] in anchors, f"no heading for {link}"
            continue
        target = (DOC.parent / link.split("#")[0]).resolve()
        assert (target.is_file() or target in PENDING) and ROOT in target.parents, f"broken link: {link}"


def test_at_least_12_exercises_over_8_lessons_predict_first_then_solution_and_run():
    exercises = {k: v for k, v in sections(DOC.read_text()).items() if k.startswith("E")}
    assert len(exercises) >= 12
    lessons = set()
    for name, body in exercises.items():
        predict, solution = body.find("**Predict"), body.find("<details>")
        assert 0 <= predict < solution, f"{name}: the prediction must be asked before the solution"
        assert ">>> " in body[solution:], f"{name}: no worked solution"
        assert mt.QUOTE.search(body[solution:]), f"{name}: the run's answer quotes no transcript"
        lessons |= set(LESSON_LINK.findall(body))
    assert len(lessons) >= 8, lessons


def run_doctests(text: str, name: str) -> doctest.TestResults:
    test = doctest.DocTestParser().get_doctest(text, {}, name, str(DOC), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test, out=sys.stdout.write)            # bound now: doctest swaps sys.stdout while it runs
    return runner.summarize(verbose=False)


@pytest.fixture(scope="module")
def model_env(real_model_path):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINITRANSFORMER_MODEL", str(real_model_path))
        yield


def test_worked_solutions_print_what_the_doc_says_and_a_wrong_number_fails(model_env):
    text = DOC.read_text()
    result = run_doctests(text, "interview")
    assert result.attempted >= 30 and result.failed == 0, result
    # the first exercise's first printed result with one digit changed: the doctest must notice
    first = re.compile(r"^>>> .*\n(?!>>>|\.\.\.)(.*\d.*)$", re.M).search(text, text.index("### E1"))
    at = first.start(1) + re.search(r"\d", first.group(1)).start()
    broken = text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1:]
    assert run_doctests(broken, "interview-broken").failed == 1


def test_refresh_takes_the_transcripts_new_numbers_and_lists_quotes_it_cannot_find(tmp_path):
    transcript = mt.transcript_for(mt.lessons()[0])
    line = next(text for text in mt.read(transcript)[1].splitlines() if re.search(r"[a-z]{3,} \d", text))
    old = mt.flat(line)
    changed = mt.NUMBER.sub(lambda m: "9" * len(m.group()), old)           # the same words, other numbers
    doc = tmp_path / "doc.md"
    doc.write_text(f"A “{changed}” and a “quote that no transcript has 1” ([t]({transcript}))\n")
    assert mt.refresh_quotes(doc) == ["quote that no transcript has 1"]
    assert f"“{old}”" in doc.read_text()


def test_refresh_keeps_a_quoted_row_on_its_own_label():
    """A table row quoted by its label (a number too) stays that row, not the first row the words fit."""
    transcript = mt.transcript_for(next(p for p in mt.lessons() if p.stem.startswith("02")))
    rows = re.findall(r"^│ prefill │ (\d+) +│ ([\d.]+) ", mt.read(transcript)[1], re.M)
    assert len(rows) >= 2
    label, value = rows[-1]
    assert mt.best_match(f"prefill │ {label} │ 1.0", mt.flat(mt.read(transcript)[1])) == f"prefill │ {label} │ {value}"
    assert mt.best_match("prefill took 1 ms at 16 tokens,", "prefill took 138 ms at 16 tokens, then") == \
        "prefill took 138 ms at 16 tokens,"


def test_refresh_keeps_a_quoted_row_in_the_table_whose_numbers_it_writes_alike():
    """Lesson 16 has a row 'no chunking' in its TTFT table (seconds, two decimals) and then in its ITL table (whole
    ms): a quote of the ITL row stays in the ITL table, though neither keeps one of its numbers."""
    text = ("│ no chunking │ 12.01 (17.14, 7.71) │ 23.13 (24.60, 2.16) │ 15.80 (17.41, 4.80) │ "
            "│ no chunking │ 172 (193, 53) │ 6299 (7354, 10358) │ 0 │")
    assert mt.best_match("no chunking │ 79 (82, 11) │ 2160 (2356, 258)", text) == \
        "no chunking │ 172 (193, 53) │ 6299 (7354, 10358)"
    assert mt.best_match("no chunking │ 2.05 (4.62, 4.94)", text) == "no chunking │ 12.01 (17.14, 7.71)"
    assert mt.written_as("1,603.5") == (1, True) and mt.written_as("1603") == (0, False)
