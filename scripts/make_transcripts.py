"""Run every lesson once at its default settings and write what it printed to lessons/transcripts/NN_name.md, for
readers who read before they run (docs/interview.md quotes its numbers from these files).

    python scripts/make_transcripts.py                 # all lessons, one after another (tens of minutes on 2 cores)
    python scripts/make_transcripts.py --only 02,12    # only these lessons (quoting the committed machine profile)
    python scripts/make_transcripts.py --log FILE      # progress to FILE as well as to the terminal
    python scripts/make_transcripts.py --verify        # check every committed transcript against its lesson's claims

Then, on the same quiet machine, everything else that quotes the machine, from the same profile:

    export MINITRANSFORMER_MACHINE_PROFILE=lessons/transcripts/machine.json
    minitransformer figures                                    # figures/*.png, machine.json, measured.json
    python lessons/12_speculative_decoding.py --figure figures/speculative_speedup.png
    minitransformer bench --repeats 3 --peers llama-batched-bench   # the README's "How fast it is" block

Each transcript opens with the lesson's WHAT_TO_LOOK_AT (a constant beside its code, read from the source): which table
or line to read first and what it decides. It states no direction a run might not show; the claim lines do that.

A lesson prints with rich; piped, it prints plain text, and COLUMNS=120 fixes the width, so the transcript is what a
reader of a 120-column terminal sees, without colour codes. Lessons run one at a time: their timings are part of
what they teach and two at once would share the cores. This machine's profile (read and copy bandwidth, GEMM
FLOP/s: minitransformer/lab/peaks.py) is measured once at the start, written to lessons/transcripts/machine.json
and handed to every lesson, so all transcripts quote one set of bandwidths, one ridge point and the floors derived
from them; each transcript's header repeats the profile's line. `minitransformer figures` and `minitransformer
bench` read the same file when $MINITRANSFORMER_MACHINE_PROFILE names it, so the figures and the README's tables
quote it too (tests/test_quoted_numbers.py holds the documents to it).

A transcript is written only from a quiet run whose claims all hold: each lesson prints its quietness probe
(minitransformer/lab/measure.py) and one verdict line per claim (minitransformer/lab/claims.py). A busy run is tried
again (--attempts); a lesson that stays busy, fails a claim or crashes keeps its old transcript, the others still
run, and the script exits 1 naming which and why.

--verify re-reads every committed transcript and decides each lesson's claims again from the numbers printed in it
(the lesson's own claims() function), checks its printed relations (claims.relation_problems: no value beyond its
own bound, no part above its whole, no slope against its endpoints, no beaten winner), that it quotes the one
machine profile of lessons/transcripts/machine.json, and that the run was quiet: an edited or stale number that no
longer supports its verdict fails, naming the transcript, the claim and its numbers. It also checks docs/interview.md:
every “quote” is in a transcript its paragraph links, and every claim a paragraph cites (claim `key`) was shown there.

docs/interview.md quotes the transcripts in “curly quotes”; after the lessons ran, each quote takes its transcript's
new numbers (refresh_quotes). A quote whose words no longer appear is listed, and the script exits 1.

outline() is the check behind tests/test_transcripts.py: a transcript must keep its lesson's section headings, table
columns and row labels (numbers masked), so a renamed section shows up as a failing test, not as a stale file.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import os
import platform
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from minitransformer.lab.claims import printed_verdicts, relation_problems, verdict_line
from minitransformer.lab.measure import QUIET_LINE, Quietness
from minitransformer.lab.peaks import PROFILE_ENV, MachineProfile, measure_profile

LESSONS = ROOT / "lessons"
TRANSCRIPTS = LESSONS / "transcripts"
PROFILE = TRANSCRIPTS / "machine.json"                # the machine profile every transcript of a run quotes
WIDTH = 120
FENCE = "````"                                        # four backticks: a lesson's output may itself contain three
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NUMBER = re.compile(r"[-+]?\d[\d,._]*")               # 1,024  0.14  -3  1e-05 (-> #e#): masked before comparing


def lessons() -> list[Path]:
    return sorted(LESSONS.glob("[0-9][0-9]_*.py"))


def transcript_for(lesson: Path) -> Path:
    return TRANSCRIPTS / f"{lesson.stem}.md"


def title(lesson: Path) -> str:
    """'the autoregressive loop' from the docstring's 'Lesson 01: the autoregressive loop — ...'."""
    first = (ast.get_docstring(ast.parse(lesson.read_text())) or lesson.stem).split("\n")[0]
    name = first.split(":", 1)[1].strip() if first.startswith("Lesson") else first
    return re.split(r" — | -- |: ", name, maxsplit=1)[0].rstrip(".")


def what_to_look_at(lesson: Path) -> list[str]:
    """The lesson's WHAT_TO_LOOK_AT: a few sentences on which table or line to read first and what it decides.
    Read from the source, not by importing it: the constant sits beside the code it describes, and writing a
    transcript must not run the lesson a second time."""
    for node in ast.parse(lesson.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "WHAT_TO_LOOK_AT" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise ValueError(f"{lesson.name} has no WHAT_TO_LOOK_AT: say which table or line a reader should read first")


def note(lesson: Path) -> list[str]:
    """The transcript's 'What to look at' lines, as render() puts them under the title, above the output."""
    bullets = [textwrap.fill(line, WIDTH - 4, initial_indent="- ", subsequent_indent="  ")
               for line in what_to_look_at(lesson)]
    return ["**What to look at**", "", *bullets, ""]


def machine() -> str:
    """Where the run happened: the CPU (as every figure names it), Python and NumPy versions, the model file."""
    import numpy

    from minitransformer.lab.peaks import machine_label
    from minitransformer.models import find_default_model
    model = os.environ.get("MINITRANSFORMER_MODEL") or find_default_model()
    return (f"{machine_label()}, Python {platform.python_version()}, NumPy {numpy.__version__}; "
            f"model {Path(model).name if model else 'the default (not yet downloaded)'}")


def run(lesson: Path, args: list[str] = (), timeout: float | None = None,
        env: dict | None = None) -> tuple[int, str, str, float]:
    """Run a lesson as a reader pipes it: plain text at WIDTH columns. Returns (exit code, stdout, stderr, seconds)."""
    env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in ("FORCE_COLOR", "LINES")}
    env.update(COLUMNS=str(WIDTH), NO_COLOR="1", TERM="dumb", PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(lesson), *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=timeout)
    return done.returncode, ANSI.sub("", done.stdout), ANSI.sub("", done.stderr), time.perf_counter() - start


def command(lesson: Path, args: list[str] = ()) -> str:
    return " ".join(["python", lesson.relative_to(ROOT).as_posix(), *args])


def render(lesson: Path, output: str, seconds: float, where: str, when: datetime.datetime,
           profile: MachineProfile) -> str:
    number = lesson.stem[:2]
    quiet = QUIET_LINE.search(flat(output))            # the probe's line as the lesson printed it
    others = "an unknown share" if quiet["others"] == "?" else f"{quiet['others']}%"
    return "\n".join([
        f"# Lesson {number} transcript: {title(lesson)}",
        "",
        *note(lesson),
        textwrap.fill(f"The complete output of one run of [`{lesson.name}`](../{lesson.name}) at its default "
                      f"settings, as printed to a pipe ({WIDTH} columns, no colour). Your numbers will differ: every "
                      "timing is this machine's. This run passed the quietness probe (nothing else was running: "
                      "other programs' share of the cores and the drift of a fixed calibration matmul are below), and "
                      "every verdict it prints was decided from the numbers it printed.", WIDTH - 4),
        "",
        f"- machine: {where}",
        f"- {profile.line()} ([machine.json](machine.json))",
        f"- command: `{command(lesson)}`",
        f"- run: {when:%Y-%m-%d %H:%M} UTC, {seconds:.0f} s including loading the model",
        f"- quietness: load average {quiet['load']} at the start, other programs used {others} of the "
        f"{quiet['cores']} cores, calibration drift {quiet['drift']}%",
        f"- regenerate: `python scripts/make_transcripts.py --only {number}`; check: "
        "`python scripts/make_transcripts.py --verify`",
        "",
        FENCE + "text",
        output.rstrip("\n"),
        FENCE,
        "",
    ])


def read(transcript: Path) -> tuple[str, str]:
    """(the command line, the lesson's output) of a transcript written by render()."""
    text = transcript.read_text()
    cmd = re.search(r"^- command: `([^`]+)`$", text, re.M)
    body = re.search(rf"^{FENCE}text\n(.*)\n{FENCE}$", text, re.M | re.S)
    if not cmd or not body:
        raise ValueError(f"{transcript} is not in make_transcripts.py's format")
    return cmd.group(1), body.group(1)


# ------------------------------------------------------------------------------------------------ the outline

def mask(text: str) -> str:
    """Numbers -> '#', whitespace dropped: two runs of a lesson differ in their numbers and in where rich wraps."""
    return re.sub(r"\s+", "", NUMBER.sub("#", text))


def outline(output: str) -> dict:
    """What must not change between a transcript and a fresh run of its lesson, read from the plain-text output:

    headings  every rule's title ('──── 1. The loop ────'), and the first words of a numbered paragraph that starts
              the output or follows a rule or a table ('2. greedy, 32 new'), or of any line numbered like '2b.'
              with a letter a-h (no wrapped sentence starts so, though one may start '1x. So': a ratio ending a
              sentence), centered or not: a table title so numbered starts flush left when it is wider than its
              table and centered when not, which the numbers in the table decide, in order
    tables    every table's column names (the rows between ┏ and ┡, wrapped cells joined), in order; a table printed
              several times in a row counts once, since how many times can depend on the settings. Not its title:
              wrapped to the table's width, it cannot be told apart from the text above it
    labels    per entry of `tables`, the first cell of each printed line of its rows (a wrapped label: its pieces)
    """
    headings, tables, labels = [], [], []
    header, body, previous = None, None, ""
    for line in output.splitlines():
        line, after = line.rstrip(), previous
        previous = line
        if m := re.fullmatch(r"─+ (.+?) ─+", line):
            headings.append(mask(m.group(1)))
        elif re.match(r" *\d{1,2}[a-h]\. \S", line) or (re.match(r"\d{1,2}\. \S", line)
                                                      and (not after or after.startswith(("─", "└")))):
            headings.append(mask(" ".join(line.split()[:4])))    # not a wrapped line: those follow text
        elif line.startswith(("┏", "┌")):                 # a table starts: with a header (┏) or without (┌)
            header, body = [], []
        elif line.startswith("┃") and header is not None:
            cells = [mask(c) for c in line.strip("┃").split("┃")]
            header = [a + c for a, c in zip(header, cells)] if header else cells
        elif line.startswith("│") and body is not None:
            if first := mask(line.strip("│").split("│")[0]):
                body.append(first)                       # a blank first cell: the row above, wrapped
        elif line.startswith("└") and body is not None:
            if tables and tables[-1] == header:
                labels[-1] += body
            else:
                tables.append(header)
                labels.append(body)
            header, body = None, None
    return {"headings": headings, "tables": tables, "labels": labels}


def same(a: str, b: str) -> bool:
    """Equal, or equal up to where rich cut one of them short with an ellipsis to fit the width."""
    if a.endswith("…") or b.endswith("…"):
        return a.rstrip("…").startswith(b.rstrip("…")) or b.rstrip("…").startswith(a.rstrip("…"))
    return a == b


def same_lists(a: list, b: list) -> bool:
    return len(a) == len(b) and all(same(x, y) if isinstance(x, str) else same_lists(x, y) for x, y in zip(a, b))


def differences(transcript: dict, fresh: dict) -> list[str]:
    """How a fresh run's outline departs from a transcript's: the same headings and table columns, in the same
    order, and every row label of the fresh run among the transcript's (a small run may print fewer rows)."""
    problems = []
    if not same_lists(transcript["headings"], fresh["headings"]):
        problems.append(f"headings: transcript {transcript['headings']} vs lesson {fresh['headings']}")
    if not same_lists(transcript["tables"], fresh["tables"]):
        problems.append(f"table columns: transcript {transcript['tables']} vs lesson {fresh['tables']}")
    else:
        for columns, old, new in zip(fresh["tables"], transcript["labels"], fresh["labels"]):
            joined = "".join(label.rstrip("…") for label in old)   # a label wrapped elsewhere: its pieces join up
            missing = [label for label in new if label.rstrip("…") not in joined
                       and not any(same(label, o) for o in old if o.endswith("…"))]
            if missing:
                problems.append(f"row labels of the table {columns[:3]}...: {missing} not in the transcript")
    return problems


# ------------------------------------------------------------------------------------------------ quotes

INTERVIEW = ROOT / "docs" / "interview.md"
QUOTE = re.compile(r"“([^”]+)”")                         # “...”: words copied from a transcript
LINK = re.compile(r"\]\(([^)\s]+)\)")


def flat(text: str) -> str:
    return " ".join(text.split())                         # rich wrapped the transcript's lines at other places


def quotes(doc: Path = INTERVIEW) -> list[tuple[str, list[Path]]]:
    """Every “quote” of a markdown file with the transcripts linked in its paragraph, where it must appear."""
    found = []
    for paragraph in re.split(r"\n\s*\n", doc.read_text()):
        linked = [(doc.parent / link.split("#")[0]).resolve() for link in LINK.findall(paragraph)]
        sources = [p for p in linked if p.parent == TRANSCRIPTS.resolve()]
        found += [(flat(q), sources) for q in QUOTE.findall(paragraph)]
    return found


QUOTED_NUMBER = r"[-+]?\d(?:[\d,._]*\d)?"              # as NUMBER, but ending in a digit: '256,' is 256 then ','


def wildcard(quote: str) -> re.Pattern:
    """The quote with every number a wildcard: '7959 ms at 256' matches '8012 ms at 256'."""
    parts = re.split(f"({QUOTED_NUMBER})", quote)                  # text, number, text, number, ..., text
    return re.compile("".join(f"({QUOTED_NUMBER})" if i % 2 else re.escape(part) for i, part in enumerate(parts)))


def best_match(quote: str, text: str) -> str | None:
    """The transcript's text the quote now stands for: of the places its words appear, the one keeping most of its
    numbers, an earlier one first ('prefill │ 64 │ 774.2' stays the row for 64, not the first prefill row), then the
    one whose numbers are written as the quote's (a row label in two tables: 'no chunking │ 79 (82, 11)' is the
    whole-ms ITL row, not the TTFT row in seconds that comes first, 'no chunking │ 12.01 (17.14, 7.71)')."""
    numbers = re.findall(QUOTED_NUMBER, quote)
    hits = list(wildcard(quote).finditer(text))
    if not hits:
        return None
    kept = [[a == b for a, b in zip(m.groups(), numbers)] for m in hits]
    alike = [sum(written_as(a) == written_as(b) for a, b in zip(m.groups(), numbers)) for m in hits]
    best = max(range(len(hits)), key=lambda i: (sum(kept[i]), alike[i], kept[i]))    # ties: the earlier number
    return hits[best].group(0)


def written_as(number: str) -> tuple[int, bool]:
    """How a number is written: its digits after the point, and whether it groups thousands ('1,603' vs '1603')."""
    whole, _, decimals = number.partition(".")
    return len(decimals), "," in whole


def rewrap(written: str, new: str) -> str:
    """The new quote with the old one's line breaks: numbers contain no spaces, so the words pair up one to one."""
    pieces, words = re.split(r"(\s+)", written[1:-1]), iter(new.split())
    return "“" + "".join(p if i % 2 else next(words) for i, p in enumerate(pieces)) + "”"


def refresh_quotes(doc: Path = INTERVIEW) -> list[str]:
    """Put the transcripts' new numbers into the quotes of `doc`: a quote whose words, numbers aside, appear in a
    transcript its paragraph links becomes that transcript's text. Returns the quotes found nowhere (fix by hand)."""
    text, stale, outputs = doc.read_text(), [], {}
    for quote, sources in quotes(doc):
        for source in sources:
            if source not in outputs:
                outputs[source] = flat(read(source)[1]) if source.is_file() else ""
        if any(quote in outputs[s] for s in sources):
            continue
        hits = [hit for hit in (best_match(quote, outputs[s]) for s in sources) if hit]
        if not hits:
            stale.append(quote)
            continue
        written = "“" + r"\s+".join(map(re.escape, quote.split())) + "”"     # the doc may wrap a quote over lines
        text = re.sub(written, lambda m, hit=hits[0]: rewrap(m.group(0), hit), text)
    doc.write_text(text)
    return stale


# ------------------------------------------------------------------------------------------------ claims

def lesson_module(lesson: Path):
    """The lesson imported as a module (its main() guarded by __name__), for its claims() function."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"lesson_{lesson.stem}", lesson)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def claim_problems(lesson: Path, output: str) -> list[str]:
    """Why `output` (a run or a transcript of `lesson`) cannot stand as a transcript; [] when it can: the run was
    quiet, every required claim holds on the printed numbers, every verdict line printed agrees with them (a
    refuted claim printed as refuted, claims.verdict_line), and every printed relation agrees with its numbers (no
    value beyond its own bound, no part above its whole, no slope against its endpoints, no beaten winner:
    claims.relation_problems)."""
    quiet = Quietness.parse(output)
    problems = []
    if quiet is None:
        problems.append("no quietness line (the lesson must print measure.Probe's line)")
    elif not quiet.quiet:
        problems.append(f"recorded on a busy machine: {quiet.why_busy()}")
    try:
        found = lesson_module(lesson).claims(output)
    except (ValueError, AttributeError, IndexError, ZeroDivisionError) as exc:
        return problems + [f"its claims cannot be read from the output: {exc}"] + relation_problems(output)
    printed, text = printed_verdicts(output), flat(output)
    for claim in found:
        if claim.required and not claim.holds:
            problems.append(f"claim {claim.key} ({claim.statement}) does not hold on the printed numbers: "
                            f"{claim.evidence}")
        elif flat(verdict_line(claim, quiet)) not in text:
            problems.append(f"claim {claim.key}: the printed verdict is not what its numbers give, which is: "
                            f"{verdict_line(claim, quiet)}")
    problems += relation_problems(output)
    unknown = set(printed) - {c.key for c in found}
    if unknown:
        problems.append(f"verdict lines for claims the lesson no longer makes: {sorted(unknown)}")
    if not found:
        problems.append("the lesson makes no claims")
    return problems


CLAIM_REF = re.compile(r"claim `([\w-]+)`")


def interview_problems(doc: Path = INTERVIEW) -> list[str]:
    """Quotes that are in none of their paragraph's transcripts, and cited claims (claim `key`) that none of them
    shows: a sentence that states a direction cites the claim that shows it."""
    problems, outputs = [], {}
    for paragraph in re.split(r"\n\s*\n", doc.read_text()):
        linked = [(doc.parent / link.split("#")[0]).resolve() for link in LINK.findall(paragraph)]
        missing = [p for p in linked if p.parent == TRANSCRIPTS.resolve() and not p.is_file()]
        if missing:            # its quotes and claims cannot be checked until the lesson has run
            problems += [f"links {p.name}, which does not exist yet: python scripts/make_transcripts.py --only "
                         f"{p.name[:2]}" for p in missing]
            continue
        sources = [p for p in linked if p.parent == TRANSCRIPTS.resolve()]
        for source in sources:
            outputs.setdefault(source, read(source)[1])
        for quote in map(flat, QUOTE.findall(paragraph)):
            if sources and not any(quote in flat(outputs[s]) for s in sources):
                problems.append(f"“{quote}” is in none of {[s.name for s in sources]}")
        for key in CLAIM_REF.findall(paragraph):
            if not any(printed_verdicts(outputs[s]).get(key) for s in sources):
                problems.append(f"claim `{key}` is cited but not shown in {[s.name for s in sources]}")
    return problems


def verify(chosen: list[Path]) -> list[str]:
    """Every problem of the committed transcripts of `chosen` and of docs/interview.md, each naming where."""
    problems = [] if PROFILE.is_file() else [f"{PROFILE.relative_to(ROOT)}: missing (the profile every transcript "
                                              "quotes)"]
    profile_line = MachineProfile.load(PROFILE).line() if PROFILE.is_file() else None
    for lesson in chosen:
        transcript = transcript_for(lesson)
        if not transcript.is_file():
            problems.append(f"{transcript.relative_to(ROOT)}: missing")
            continue
        problems += [f"{transcript.relative_to(ROOT)}: {p}" for p in claim_problems(lesson, read(transcript)[1])]
        printed = set(re.findall(r"machine profile \(.*?\(GEMM / read\)", flat(transcript.read_text())))
        if profile_line and printed != {profile_line}:
            problems.append(f"{transcript.relative_to(ROOT)}: quotes the machine profile(s) {sorted(printed)}, not "
                            f"{PROFILE.relative_to(ROOT)}'s: {profile_line}")
    if INTERVIEW.is_file():
        problems += [f"{INTERVIEW.relative_to(ROOT)}: {p}" for p in interview_problems()]
    return problems


# ------------------------------------------------------------------------------------------------ main

def main() -> int:
    ap = argparse.ArgumentParser(description="Run every lesson at its default settings and write "
                                             "lessons/transcripts/NN_name.md from what it printed.")
    ap.add_argument("--only", help="comma-separated lesson numbers, e.g. 02,12 (default: every lesson)")
    ap.add_argument("--log", type=Path, help="append progress lines to this file as well")
    ap.add_argument("--verify", action="store_true",
                    help="run no lesson: check the committed transcripts' claims against their printed numbers")
    ap.add_argument("--attempts", type=int, default=3, help="runs of a lesson before giving up on a quiet one")
    args = ap.parse_args()
    chosen = lessons()
    if args.only:
        wanted = {n.strip().zfill(2) for n in args.only.split(",")}
        unknown = wanted - {p.stem[:2] for p in chosen}
        if unknown:
            ap.error(f"no lesson numbered {', '.join(sorted(unknown))}")
        chosen = [p for p in chosen if p.stem[:2] in wanted]

    def say(message: str) -> None:
        line = f"{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S} {message}"
        print(line, flush=True)
        if args.log:
            with args.log.open("a") as handle:
                handle.write(line + "\n")

    if args.verify:
        problems = verify(chosen)
        for problem in problems:
            print(problem)
        print(f"{len(chosen)} transcripts and {INTERVIEW.name} checked: "
              + (f"{len(problems)} problems" if problems else "every claim holds on its printed numbers"))
        return 1 if problems else 0

    where, failed, stale = machine(), [], []
    TRANSCRIPTS.mkdir(exist_ok=True)
    say(f"{len(chosen)} lessons on {where}")
    if os.environ.get(PROFILE_ENV):
        profile = MachineProfile.load(Path(os.environ[PROFILE_ENV]))
    elif args.only and PROFILE.is_file():          # the other transcripts quote the committed profile: keep it
        profile = MachineProfile.load(PROFILE)
    else:
        profile = measure_profile(repeats=20)
    if args.only and PROFILE.is_file() and MachineProfile.load(PROFILE) != profile:
        ap.error(f"--only with a profile other than {PROFILE.relative_to(ROOT)}: the transcripts not rerun quote that "
                 "one; rerun every lesson to change it")
    profile.save(PROFILE)            # a lesson that fails below keeps its old transcript, which --verify then names
    say(f"for every lesson of this run: {profile.line()}")
    for lesson in chosen:
        for attempt in range(1, args.attempts + 1):
            say(f"{lesson.name} (attempt {attempt}) ...")
            when = datetime.datetime.now(datetime.timezone.utc)
            code, out, err, seconds = run(lesson, env={PROFILE_ENV: str(PROFILE)})
            if code != 0 or not out.strip():
                problems = [f"exit {code}: " + err[-2000:]]
                break                                           # a crash does not get better by trying again
            problems = claim_problems(lesson, out)
            quiet = Quietness.parse(out)
            if not problems:
                transcript_for(lesson).write_text(render(lesson, out, seconds, where, when, profile))
                say(f"{lesson.name} done in {seconds:.0f} s -> {transcript_for(lesson).relative_to(ROOT)}")
                break
            say(f"{lesson.name}: not written after {seconds:.0f} s: " + "; ".join(problems))
            if quiet is not None and quiet.quiet:
                break                                           # quiet, yet a claim failed: say so, do not retry
        if problems:
            failed.append(lesson.name)
            say(f"{lesson.name} FAILED; its transcript is unchanged: " + "; ".join(problems))
    if failed:
        say(f"failed: {', '.join(failed)}")
    if INTERVIEW.is_file():
        stale = refresh_quotes()
        say(f"{INTERVIEW.relative_to(ROOT)}: quotes updated to the new numbers"
            + (f"; found in no linked transcript, fix by hand: {stale}" if stale else ""))
    return 1 if failed or stale else 0


if __name__ == "__main__":
    sys.exit(main())
