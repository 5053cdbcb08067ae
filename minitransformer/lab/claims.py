"""A lesson's claims, decided from the numbers it printed, so its verdicts can never contradict its own output.

Each lesson has a function `claims(output) -> list[Claim]` that reads its printed text (tables and `check ...` lines)
and decides each claim from those numbers alone. The lesson calls it on what it has just printed and report() prints
a verdict line per claim; `scripts/make_transcripts.py --verify` calls the same function on a committed transcript,
so an edited or stale number that no longer supports its verdict is caught.

A claim about time is shown only when it holds beyond the measured spread *and* the run was quiet (measure.Probe):
on a busy machine a lesson says plainly that this run could not show it, and why. On a quiet machine a claim that
does not hold is not bad luck: where the numbers show the opposite beyond the spread the claim is `refuted`, and the
verdict says so; otherwise the difference was inside the spread, and the verdict says that. Only a busy run asks
the reader to run it again. A claim that is not about time (the same tokens, the same bytes) needs no quiet machine.

Besides the claims, a lesson prints its relations in a few fixed forms that relation_problems() checks in every
transcript, whatever the lesson (the kinds a reader caught contradicting themselves):

    bound KEY: measured 16.4 ms, floor 14.2 ms      a measured value against its own floor (or ceiling): it may not
                                                    land beyond it unless the line says why ('; beyond it: ...')
    part KEY: queue p99 1.20 s of TTFT p99 1.90 s   a part may not be larger than its whole unless the line says why
    16.4 -> 17.0 ms (slope +31 us per token)        a printed slope must have the sign of its endpoints
    best on tok/s (highest): 8 slots (70.4)         the named winner must beat every other cell of that table row or
                                                    column

Most claims are what the lesson teaches: a committed transcript must show every one of them. A few are questions
whose answer depends on the machine or the text (is int8 faster than float32 in NumPy here? does one flipped
near-tie change a greedy continuation?): those are `required=False`, and a quiet run may answer either way, as long
as what it prints follows from its numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .measure import Quietness, Timing

NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"        # 1,024  0.14  -3  1e-05


@dataclass(frozen=True)
class Claim:
    """One thing a lesson teaches, checked on its own numbers. `evidence` holds the numbers and the margin."""
    key: str                  # a short stable name: 'cache-flat'
    statement: str            # 'a cached decode step stays flat as the context grows'
    holds: bool
    evidence: str             # 'last quarter 18.4 ms vs first 17.9 ms (+3%), band ±25%'
    timed: bool = True        # about time: needs a quiet run to be shown
    required: bool = True     # a transcript must show it (False: an open question the run answers either way)
    refuted: bool = False     # a timed claim's numbers show the opposite beyond their spread (read when holds is
                              # False; an untimed claim that does not hold is always refuted: counts have no spread)


def is_shown(claim: Claim, quiet: Quietness | None) -> bool:
    return claim.holds and (not claim.timed or (quiet is not None and quiet.quiet))


def verdict_line(claim: Claim, quiet: Quietness | None) -> str:
    """'claim KEY: shown: ...', 'claim KEY: refuted: ...' or 'claim KEY: not shown: ... and why' (CLAIM_LINE reads
    it back). A busy run cannot refute or show a timed claim: it asks for another run. A quiet one says what its
    numbers showed."""
    if is_shown(claim, quiet):
        return f"claim {claim.key}: shown: {claim.statement} ({claim.evidence})"
    busy = claim.timed and not (quiet is not None and quiet.quiet)
    if busy:
        why = f"the machine was busy ({quiet.why_busy() if quiet else 'no quietness probe'})"
        return (f"claim {claim.key}: not shown: {claim.statement} ({claim.evidence}). This run could not show it: "
                f"{why}. Close other programs and run the lesson again; see lessons/README.md, 'Reading numbers "
                "honestly'.")
    if not claim.timed:                   # a count or a comparison of exact values has no spread to hide in
        return f"claim {claim.key}: refuted: {claim.statement} ({claim.evidence}). Its numbers contradict it."
    if claim.refuted:
        return (f"claim {claim.key}: refuted: {claim.statement} ({claim.evidence}). On this quiet run the numbers "
                "show the opposite, beyond their spread.")
    return (f"claim {claim.key}: not shown: {claim.statement} ({claim.evidence}). On this quiet run its numbers do "
            "not show it, and do not show the opposite either: the evidence says how far they fell short.")


def report(console, found: list[Claim], quiet: Quietness | None) -> dict[str, bool]:
    """Print one verdict line per claim; returns {key: shown}, which the lesson's answer reads before it states a
    direction (no fixed sentence may say what the numbers did not show)."""
    for claim in found:
        console.print(verdict_line(claim, quiet), markup=False, highlight=False)
    return {claim.key: is_shown(claim, quiet) for claim in found}


CLAIM_LINE = re.compile(r"^claim (\S+): (shown|not shown|refuted):", re.M)


def printed_verdicts(text: str) -> dict[str, bool]:
    """{key: shown} as the lesson printed them (refuted and not shown are both not shown)."""
    return {m.group(1): m.group(2) == "shown" for m in CLAIM_LINE.finditer(text)}


# ------------------------------------------------------------------------------------------------ reading numbers

def flat(text: str) -> str:
    """Whitespace collapsed: rich wraps a long line wherever the terminal's width puts the break."""
    return " ".join(text.split())


def to_float(cell: str) -> float:
    """'1,234.5 ms' -> 1234.5; '3.4x' -> 3.4; '47%' -> 47.0: the first number in a table cell."""
    m = re.search(NUMBER, cell)
    if not m:
        raise ValueError(f"no number in {cell!r}")
    return float(m.group(0).replace(",", ""))


def find_numbers(text: str, pattern: str) -> list[float]:
    """The groups of `pattern` (written with NUMBER groups) found in the flattened text, as floats; ValueError when
    the pattern is missing (a transcript that lacks a check line cannot support its claim)."""
    m = re.search(pattern, flat(text))
    if not m:
        raise ValueError(f"the output has no line matching {pattern!r}")
    return [float(g.replace(",", "")) for g in m.groups()]


@dataclass
class PrintedTable:
    """A rich table read back from plain text: its column names and its rows of cells (wrapped cells joined)."""
    columns: list[str]
    rows: list[list[str]]

    def column(self, name: str) -> list[str]:
        """The cells of the first column whose name starts with `name`."""
        for i, column in enumerate(self.columns):
            if column.startswith(name):
                return [row[i] for row in self.rows]
        raise ValueError(f"no column {name!r} in {self.columns}")

    def numbers(self, name: str) -> list[float]:
        return [to_float(cell) for cell in self.column(name)]


def tables(text: str) -> list[PrintedTable]:
    """Every table rich printed with a header (┏ ... ┃ names ┃ ... ┡ rows │ ... └), in order. A line whose first
    cell is blank, or whose other cells all are, continues the row above (rich wrapped it)."""
    found: list[PrintedTable] = []
    columns: list[str] | None = None
    rows: list[list[str]] | None = None
    for line in text.splitlines():
        line = line.rstrip()
        if line.startswith("┏"):
            columns, rows = [], None
        elif line.startswith("┃") and columns is not None and rows is None:
            cells = [c.strip() for c in line.strip("┃").split("┃")]
            columns = [f"{a} {c}".strip() for a, c in zip(columns, cells)] if columns else cells
        elif line.startswith("┡") and columns is not None:
            rows = []
        elif line.startswith("│") and rows is not None:
            cells = [c.strip() for c in line.strip("│").split("│")]
            if rows and (not cells[0] or not any(cells[1:])):        # a wrapped cell: the row above goes on
                rows[-1] = [f"{a} {c}".strip() for a, c in zip(rows[-1], cells)]
            else:
                rows.append(cells)
        elif line.startswith("└") and columns is not None and rows is not None:
            found.append(PrintedTable(columns, rows))
            columns, rows = None, None
    return found


def table_with(text: str, column: str) -> PrintedTable:
    """The first printed table that has a column whose name starts with `column`."""
    for table in tables(text):
        if any(c.startswith(column) for c in table.columns):
            return table
    raise ValueError(f"the output has no table with a column {column!r}")


# ------------------------------------------------------------------------------------------------ spread cells

def spread_cell(values, fmt: str = ".2f") -> str:
    """'4.74 (4.80, 0.12)': the fastest of repeated timings (what a quiet machine gives), the median, the spread
    (max - min). cell_range() reads it back."""
    timing = Timing(tuple(values))
    return f"{timing.min:{fmt}} ({timing.median:{fmt}}, {timing.spread:{fmt}})"


def cell_range(text: str) -> tuple[float, float]:
    """[fastest, slowest] of a spread_cell 'min (median, spread)'."""
    low, _, spread = (float(x) for x in re.findall(r"\d+(?:\.\d+)?", text))
    return low, low + spread


def below(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """A's whole range lies below B's: a difference beyond both runs' spread."""
    return a[1] < b[0]


def span(r: tuple[float, float], unit: str = "s") -> str:
    """'1.15-1.21 s': a range as a claim's evidence prints it."""
    return f"{r[0]:.2f}-{r[1]:.2f} {unit}"


# ------------------------------------------------------------------------------------------------ relations

def bound_line(key: str, measured: float, bound: float, unit: str = "ms", kind: str = "floor", fmt: str = ".1f",
               why: str = "") -> str:
    """'bound KEY: measured 16.4 ms, floor 14.2 ms': a measured value printed beside its own bound. A floor is what
    the value cannot be below, a ceiling what it cannot be above; when a run lands beyond it anyway, `why` must say
    why ('; beyond it: ...'), or relation_problems refuses the transcript."""
    line = f"bound {key}: measured {measured:{fmt}} {unit}, {kind} {bound:{fmt}} {unit}"
    return line + (f"; beyond it: {why}" if why else "")


def part_line(key: str, part_label: str, part: float, whole_label: str, whole: float, unit: str = "s",
              fmt: str = ".2f", why: str = "") -> str:
    """'part KEY: queue p99 1.20 s of TTFT p99 1.90 s (63%)': a part beside its whole. A part larger than its whole
    needs `why` ('; more than the whole: ...')."""
    line = (f"part {key}: {part_label} {part:{fmt}} {unit} of {whole_label} {whole:{fmt}} {unit} "
            f"({part / whole:.0%})" if whole else f"part {key}: {part_label} {part:{fmt}} {unit} of {whole_label} "
            f"{whole:{fmt}} {unit}")
    return line + (f"; more than the whole: {why}" if why else "")


def winner_line(metric: str, highest: bool, values: dict[str, float], fmt: str = ".1f") -> str:
    """'best on tok/s (highest): continuous, 8 slots (70.4)': the row or column of a printed table that wins on
    `metric`, named from the numbers themselves. relation_problems checks it against the table."""
    pick = max if highest else min
    name = pick(values, key=lambda k: values[k])
    return f"best on {metric} ({'highest' if highest else 'lowest'}): {name} ({values[name]:{fmt}})"


_N = f"({NUMBER})"                                         # a printed number, captured
BOUND = re.compile(rf"bound (\S+): measured {_N} (\S+), (floor|ceiling) {_N} \3(; beyond it: )?")
PART = re.compile(rf"part (\S+): (.+?) {_N} (\S+) of (.+?) {_N} \4(?: \(-?\d+%\))?(; more than the whole: )?")
SLOPE = re.compile(rf"{_N} -> {_N} [^\s(]+ \(slope {_N}")
WINNER = re.compile(rf"best on (.+?) \((highest|lowest)\): (.+?) \({_N}\)")


def _value(cell: str) -> float | None:
    try:
        return to_float(cell)
    except ValueError:
        return None


def _contenders(text: str, metric: str) -> dict[str, float] | None:
    """{label: value} of `metric` in a printed table: a row labelled `metric` (its columns are the contenders) or
    a column named `metric` (its rows are); None when no table has it."""
    for table in tables(text):
        for row in table.rows:
            if row and row[0] == metric:
                return {c: v for c, cell in zip(table.columns[1:], row[1:]) if (v := _value(cell)) is not None}
        for i, column in enumerate(table.columns):
            if column == metric:
                return {row[0]: v for row in table.rows if (v := _value(row[i])) is not None}
    return None


def relation_problems(text: str) -> list[str]:
    """What the printed relations of `text` (a lesson's output) contradict, each naming the line: a value beyond its
    own bound without a reason, a part larger than its whole without one, a slope whose sign is not its endpoints',
    a winner that a printed cell beats. [] when every relation agrees with its numbers."""
    problems, plain = [], flat(text)
    for m in BOUND.finditer(plain):
        measured, bound, explained = to_float(m[2]), to_float(m[5]), bool(m[6])
        beyond = measured < bound if m[4] == "floor" else measured > bound
        if beyond and not explained:
            problems.append(f"bound {m[1]}: measured {m[2]} {m[3]} is beyond its own {m[4]} of {m[5]} {m[3]}, and "
                            "the line does not say why")
    for m in PART.finditer(plain):
        if to_float(m[3]) > to_float(m[6]) and not m[7]:
            problems.append(f"part {m[1]}: {m[2]} {m[3]} {m[4]} is larger than its whole, {m[5]} {m[6]} {m[4]}, "
                            "and the line does not say why")
    for m in SLOPE.finditer(plain):
        first, last, slope = to_float(m[1]), to_float(m[2]), to_float(m[3])
        if (last - first) * slope < 0:              # equal printed ends: any slope rounds to them
            problems.append(f"'{m[0]}': a slope of {m[3]} between {m[1]} and {m[2]} has the wrong sign")
    for m in WINNER.finditer(plain):
        metric, highest, name, value = m[1], m[2] == "highest", m[3], to_float(m[4])
        contenders = _contenders(text, metric)
        if contenders is None:
            problems.append(f"'{m[0]}': no printed table has a row or column named {metric!r}")
            continue
        if name not in contenders:
            problems.append(f"'{m[0]}': {name!r} is not among {sorted(contenders)}")
            continue
        beaten = [c for c, v in contenders.items() if (v > contenders[name] if highest else v < contenders[name])]
        if beaten or contenders[name] != value:
            problems.append(f"'{m[0]}': the table says {metric} of {name!r} is {contenders[name]}, and "
                            f"{', '.join(f'{c} ({contenders[c]})' for c in beaten) or 'no other'} beats it")
    return problems
