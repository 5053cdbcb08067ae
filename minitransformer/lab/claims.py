"""A lesson's claims, decided from the numbers it printed, so its verdicts can never contradict its own output.

Each lesson has a function `claims(output) -> list[Claim]` that reads its printed text (tables and `check ...` lines)
and decides each claim from those numbers alone. The lesson calls it on what it has just printed and report() prints
a verdict line per claim; `scripts/make_transcripts.py --verify` calls the same function on a committed transcript,
so an edited or stale number that no longer supports its verdict is caught.

A claim about time is shown only when it holds beyond the measured spread *and* the run was quiet (measure.Probe):
on a busy machine a lesson says plainly that this run could not show it, and why. A claim that is not about time
(the same tokens, the same bytes) needs no quiet machine.

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


def is_shown(claim: Claim, quiet: Quietness | None) -> bool:
    return claim.holds and (not claim.timed or (quiet is not None and quiet.quiet))


def verdict_line(claim: Claim, quiet: Quietness | None) -> str:
    """'claim KEY: shown: ...' or 'claim KEY: not shown: ... and why' (CLAIM_LINE reads it back)."""
    if is_shown(claim, quiet):
        return f"claim {claim.key}: shown: {claim.statement} ({claim.evidence})"
    line = f"claim {claim.key}: not shown: {claim.statement} ({claim.evidence}). This run could not show it: "
    if not claim.timed:
        return line + "its numbers do not show it."
    why = "its numbers do not show it" if not claim.holds else \
        f"the machine was busy ({quiet.why_busy() if quiet else 'no quietness probe'})"
    return line + (f"{why}. Close other programs and run the lesson again; see lessons/README.md, 'Reading numbers "
                   "honestly'.")


def report(console, found: list[Claim], quiet: Quietness | None) -> dict[str, bool]:
    """Print one verdict line per claim; returns {key: shown}, which the lesson's answer reads before it states a
    direction (no fixed sentence may say what the numbers did not show)."""
    for claim in found:
        console.print(verdict_line(claim, quiet), markup=False, highlight=False)
    return {claim.key: is_shown(claim, quiet) for claim in found}


CLAIM_LINE = re.compile(r"^claim (\S+): (shown|not shown):", re.M)


def printed_verdicts(text: str) -> dict[str, bool]:
    """{key: shown} as the lesson printed them."""
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
