"""Every machine figure a document quotes comes from one machine profile, and matches it (issue 46).

lessons/transcripts/machine.json is the profile make_transcripts.py measured once and handed to every lesson;
`minitransformer figures` and `minitransformer bench` read the same file when $MINITRANSFORMER_MACHINE_PROFILE names
it, and write what they used (figures/machine.json, the README's bench block). Outside the transcripts, a document
may quote a bandwidth or a FLOP rate only as one of:
- a published figure (lab/machine.py's datasheet constants: the H200, NVLink, PCIe, InfiniBand);
- in docs/interview.md, a “quote” of a transcript, which `make_transcripts.py --verify` finds in the transcript
  it links (the other documents' curly quotes are no such quotes, and count as the document's own words);
- a value of the profile the document names (a link to a machine.json), at the precision it is printed;
- a figure an exercise asks the reader to assume (HYPOTHETICAL, each with why).
A regenerated profile thus cannot leave a stale copy behind: the document fails here until it quotes the new one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from minitransformer.bench.report import FOOTNOTES
from minitransformer.lab.machine import H200, IB_NDR, NVLINK4, PCIE5
from minitransformer.lab.peaks import MachineProfile

ROOT = Path(__file__).resolve().parents[1]
TRANSCRIPTS_PROFILE = ROOT / "lessons" / "transcripts" / "machine.json"
FIGURES_PROFILE = ROOT / "figures" / "machine.json"
DOCS = sorted([ROOT / "README.md", ROOT / "figures" / "README.md", ROOT / "lessons" / "README.md",
               ROOT / "exercises" / "README.md", *(ROOT / "docs").glob("*.md"),
               *(ROOT / "minitransformer").rglob("*.py")])            # the modules' docstrings and comments
RATE = re.compile(r"(?<![\w.,])(\d[\d,]*(?:\.\d+)?) ?(GB/s|TB/s|GFLOP/s|TFLOP/s|TFLOPS)\b"
                  r"|ridge[^.\d]{0,24}?~?(\d+(?:\.\d+)?) (FLOP/byte)")   # a ridge point: GEMM peak / bandwidth
QUOTE = re.compile(r"“[^”]*”")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)

# (document, the words around the figure) -> why it is no measurement: an exercise's premise.
HYPOTHETICAL = {("interview.md", "16 GB/s"): "E4 asks the reader to assume a machine that streams 16 GB/s"}


def published() -> set[tuple[float, str]]:
    """The datasheet figures lab/machine.py holds, in the units a document would write them."""
    rates = {(H200.bandwidth / 1e12, "TB/s"), (round(H200.flops / 1e12), "TFLOP/s"), (990.0, "TFLOP/s"),
             (1979.0, "TFLOPS")}                                   # 1,979 with sparsity: the datasheet's headline
    for link in (NVLINK4, PCIE5, IB_NDR):
        rates.add((link.bandwidth / 1e9, "GB/s"))
    rates.add((2 * NVLINK4.bandwidth / 1e9, "GB/s"))                 # NVLink's 900 GB/s counts both directions
    rates |= {(round(H200.ridge), "FLOP/byte"), (200.0, "FLOP/byte")}     # the H200's, and '~200' of it
    return rates


def profile_values(profile: MachineProfile) -> dict[str, float]:
    return {"GB/s": [profile.read_bandwidth / 1e9, profile.copy_bandwidth / 1e9],
            "GFLOP/s": [profile.gemm_peak / 1e9], "FLOP/byte": [profile.ridge]}


def at_precision(value: float, written: str) -> str:
    decimals = len(written.split(".")[1]) if "." in written else 0
    return f"{value:,.{decimals}f}" if "," in written else f"{value:.{decimals}f}"


def own_words(doc: Path) -> str:
    """The document's text less fenced code (worked arithmetic, run by its own tests) and, in docs/interview.md,
    less its “quotes” (each one checked against its transcript by --verify)."""
    text = FENCE.sub("", doc.read_text())
    return QUOTE.sub("“”", text) if doc.name == "interview.md" else text


def quoted_rates(text: str) -> list[tuple[str, str, str]]:
    """(number as written, unit, the line it is on) of every rate in `text`."""
    return [(m[1] or m[3], m[2] or m[4], text[text.rfind("\n", 0, m.start()) + 1:text.find("\n", m.end())])
            for m in RATE.finditer(text)]


def test_the_figures_and_the_transcripts_quote_one_profile():
    """Made together, the figures read the transcripts' profile: one set of machine numbers for every document."""
    transcripts = MachineProfile.load(TRANSCRIPTS_PROFILE)
    assert MachineProfile.load(FIGURES_PROFILE) == transcripts


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_machine_figure_a_document_quotes_is_its_source_runs(doc):
    text = own_words(doc)
    sources = {name: MachineProfile.load(path) for name, path in (("lessons/transcripts/machine.json",
                                                                   TRANSCRIPTS_PROFILE),
                                                                  ("figures/machine.json", FIGURES_PROFILE))
               if f"{Path(name).parent.name}/machine.json" in text or (doc.parent == path.parent
                                                                         and "machine.json" in text)}
    known = published()
    for number, unit, line in quoted_rates(text):
        value = float(number.replace(",", ""))
        if (value, unit) in known or any(doc.name == d and words in line for (d, words) in HYPOTHETICAL):
            continue
        assert sources, (f"{doc.relative_to(ROOT)} quotes {number} {unit} but names no machine.json it comes from: "
                         f"{line.strip()!r}")
        matches = [name for name, profile in sources.items()
                   if number in (at_precision(v, number) for v in profile_values(profile).get(unit, []))]
        assert matches, (f"{doc.relative_to(ROOT)} quotes {number} {unit}, which none of {sorted(sources)} holds "
                         f"(regenerate or requote): {line.strip()!r}")


def test_a_stale_figure_is_caught(tmp_path):
    """The check itself: a bandwidth one digit off the profile, or with no profile named, fails."""
    profile = MachineProfile.load(TRANSCRIPTS_PROFILE)
    good = f"{profile.read_bandwidth / 1e9:.1f}"
    values = profile_values(profile)["GB/s"]
    stale = next(s for k in range(1, 100) if (s := f"{profile.read_bandwidth / 1e9 + 0.1 * k:.1f}")
                 not in (at_precision(v, s) for v in values))       # off by a digit, and no other figure's value
    assert good in (at_precision(v, good) for v in values)
    assert stale not in (at_precision(v, stale) for v in values)
    interview = tmp_path / "interview.md"
    interview.write_text(f"read at {stale} GB/s, and “{stale} GB/s” in a quote, and\n```\n{stale} GB/s\n```\n")
    assert quoted_rates(own_words(interview)) == [(stale, "GB/s", f"read at {stale} GB/s, and “” in a quote, and")]
    other = tmp_path / "README.md"
    other.write_text(interview.read_text())
    assert [r[0] for r in quoted_rates(own_words(other))] == [stale, stale]       # not a verified quote there


def test_the_readme_bench_block_quotes_the_profile_it_ran_with():
    """The README's table comes from a `minitransformer bench` run handed the transcripts' profile: its first line
    prints that profile's read and copy bandwidth and GEMM peak, and its prose ceiling is the table's roofline."""
    text = (ROOT / "README.md").read_text()
    profile = MachineProfile.load(TRANSCRIPTS_PROFILE)
    line = re.search(r"read bandwidth ([\d.]+) GB/s, copy ([\d.]+) GB/s \(read \+ write\), float32 GEMM ([\d.]+) "
                     r"GFLOP/s", text)
    assert line, "the README has no bench block in `minitransformer bench`'s words"
    assert line.groups() == (f"{profile.read_bandwidth / 1e9:.1f}", f"{profile.copy_bandwidth / 1e9:.1f}",
                             f"{profile.gemm_peak / 1e9:.1f}")
    row = re.search(r"^\| decode batch 1 \(tok/s\) \| ([\d.]+) \| [^|]+ \| ([\d.]+) \|", text, re.M)
    assert row, "the bench table has no decode batch 1 row"
    ceiling = re.search(r"against our ceiling of (\d+)\)", text)
    assert ceiling and ceiling.group(1) == f"{float(row.group(2)):.0f}"


def test_the_readme_bench_definitions_are_the_reports_own():
    """The README's Definitions under its bench table are bench.md's footnotes word for word: a copy typed once
    went stale (it divided the roofline by the copy bandwidth after the code had moved to the read bandwidth)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<details><summary>Definitions</summary>\n\n(.*?)\n</details>", text, re.S)
    assert block, "the README's bench table has no Definitions block"
    assert block.group(1) == FOOTNOTES


FLOOR = re.compile(r"(floor|ceiling)s?(?: \w+){0,3}? (?:of |is |at |= |from )?~?(\d[\d,]*(?:\.\d+)?)"
                   r"(?: to \d[\d,]*(?:\.\d+)?)? ?(ms|us|tok/s|tokens/s)\b")    # 'floor of 18.0 ms', 'floor goes from
                                                                                # 13.9 to 16.2 ms'; not '2x the floor)'
CODE = re.compile(r"`[^`]*`")


@pytest.mark.parametrize("doc", [d for d in DOCS if d.suffix == ".md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_a_floor_or_ceiling_outside_the_transcripts_is_a_quote_of_one(doc):
    """A floor is a bandwidth's consequence: a document that states one in ms or tokens/s states it as a “quote” of
    the transcript that derived it (checked by --verify), so the two cannot drift apart. Code spans (a line's
    format, shown as an example) and fenced blocks (worked arithmetic, run by tests/test_interview.py) are not
    quotes of a run."""
    text = " ".join(CODE.sub("", own_words(doc)).split())
    stated = [m.group(0) for m in FLOOR.finditer(text)]
    assert not stated, f"{doc.relative_to(ROOT)} states a floor that is no quote of its source run: {stated}"
