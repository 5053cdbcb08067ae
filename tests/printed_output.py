"""Editing a lesson's printed output as if the run had printed another number: the tests of each lesson's claims()
change one cell and check that the claim it supports flips (what `make_transcripts.py --verify` relies on)."""

from __future__ import annotations

import math

from minitransformer.lab.claims import tables


def edit_cell(output: str, column: str, row_label: tuple[str, ...], value: str, table: str | None = None) -> str:
    """The output with one cell replaced (its width kept): in the first table that has a column `table` (default:
    `column`), the first row whose first cells are `row_label`. A cell rich wrapped onto the lines below (claims.tables
    joins them back) is replaced whole: its continuation in that column is blanked, so the edited row reads `value`
    at any terminal width."""
    found = tables(output)
    wanted = next(i for i, t in enumerate(found) if (table or column) in t.columns)
    index = found[wanted].columns.index(column)
    lines, seen = output.splitlines(), -1
    for i, line in enumerate(lines):
        seen += line.startswith("┏")
        cells = line.strip("│").split("│") if line.startswith("│") else []
        if seen == wanted and tuple(c.strip() for c in cells[:len(row_label)]) == row_label:
            cells[index] = f" {value}".ljust(len(cells[index]))
            lines[i] = "│" + "│".join(cells) + "│"
            for j in range(i + 1, len(lines)):               # its wrapped continuation lines, as tables() sees them
                more = lines[j].strip("│").split("│") if lines[j].startswith("│") else []
                if len(more) != len(cells) or (more[0].strip() and any(c.strip() for c in more[1:])):
                    break
                more[index] = " " * len(more[index])
                lines[j] = "│" + "│".join(more) + "│"
            return "\n".join(lines)
    raise AssertionError(f"no row {row_label} in the table with {column!r}")


def set_cells(output: str, first_cell: str, cells: dict[int, str], after: str = "") -> str:
    """The output with some cells of one table row replaced: the first row whose first cell is `first_cell` (after
    the first line containing `after`). Column widths need not match: claims read cells between the bars."""
    lines = output.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if after in line)
    for i in range(start, len(lines)):
        parts = lines[i].rstrip("\n").split("│")
        if len(parts) > 2 and parts[1].strip() == first_cell:
            for index, value in cells.items():
                parts[index + 1] = f" {value} "
            lines[i] = "│".join(parts) + "\n"
            return "".join(lines)
    raise AssertionError(f"no row {first_cell!r}")


def timing_cells_agree(fastest: float, median: float, spread: float, decimals: int) -> bool:
    """Whether a printed (fastest, median, spread) triple can come from one Timing: fastest <= median <= fastest +
    spread before rounding. Each cell is rounded to `decimals` places, so each may be off by half a unit: the first
    inequality can be off by two half-units (fastest and median), the second by three (all three cells)."""
    half = half_unit(decimals)
    return fastest <= median + 2 * half and median <= fastest + spread + 3 * half


def half_unit(decimals: int) -> float:
    """How far a number printed to `decimals` places can be from the value it was printed from (the 1e-9: a
    half-unit printed exactly, in binary)."""
    return 0.5 * 10.0 ** -decimals * (1 + 1e-9)


def half_unit_e(printed: float, mantissa_decimals: int) -> float:
    """The same for a number printed in e-notation ('1.2e-06' has 1 mantissa decimal: off by up to 0.05e-06)."""
    if printed == 0:                                         # '0.0e+00' is only ever printed from 0
        return 0.0
    return 0.5 * 10.0 ** (math.floor(math.log10(abs(printed))) - mantissa_decimals) * (1 + 1e-9)


def rounds_from(printed: float, decimals: int) -> tuple[float, float]:
    """The values a number printed to `decimals` places can have been printed from."""
    return printed - half_unit(decimals), printed + half_unit(decimals)


def printed_alike(fine: float, fine_decimals: int, coarse: float, coarse_decimals: int) -> bool:
    """Whether two printed cells can be one value rounded twice: to `fine_decimals` places in one place and to
    `coarse_decimals` in another. Rounding the finer print again is not enough: 32.5503 prints as 32.55 and 32.6,
    and round(32.55, 1) is 32.5 (32.55 is 32.5499... in binary). Each print is off by at most its half-unit."""
    return abs(fine - coarse) <= half_unit(fine_decimals) + half_unit(coarse_decimals)


def quotient_agrees(printed: float, decimals: int, numerator: tuple[float, float],
                    denominator: tuple[float, float]) -> bool:
    """Whether a printed quotient (`decimals` places) can be numerator / denominator, each given as the (low, high)
    range it lies in (`rounds_from` for a printed number, (x, x) for an exact one; both positive). A lesson divides
    its unrounded numbers, so the printed ratio of two printed numbers can miss their quotient by more than its own
    rounding: 500.5186 / 40.8531 prints 12.3, while 500.5 / 40.9 is 12.24."""
    low, high = numerator[0] / denominator[1], numerator[1] / denominator[0]
    return low - half_unit(decimals) <= printed <= high + half_unit(decimals)
