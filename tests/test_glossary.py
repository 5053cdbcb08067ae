"""docs/glossary.md and docs/reading.md hold up.

- Every term of the glossary has its own heading, a definition in words, and names files of the repository that
  exist: the place a reader goes to see the term measured.
- Every link to the glossary, from docs/, the READMEs and the lessons' docstrings, lands on a heading that exists.
- In lessons/README.md and docs/interview.md, the first use of each key term is a link to its glossary entry. A use
  counts when it is running text: headings, code, link targets and “quotes” copied from a transcript are skipped,
  since none of them can carry a link.
- Every entry of the reading list names a lesson script that exists.

Nothing here runs the model: these are checks on text.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "docs" / "glossary.md"
READING = ROOT / "docs" / "reading.md"
FIRST_USE_FILES = [ROOT / "lessons" / "README.md", ROOT / "docs" / "interview.md"]

LINK = re.compile(r"\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)")          # [text](target); text may hold [x]
HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$", re.M)

# term -> (its glossary anchor, the pattern of a use in running text)
KEY_TERMS = {
    "TTFT": ("ttft", r"\bTTFT\b"),
    "ITL": ("itl", r"\bITL\b"),
    "TPOT": ("tpot", r"\bTPOT\b"),
    "KV cache": ("kv-cache", r"(?i)\bKV[ -]cache\b"),
    "prefill": ("prefill", r"(?i)\bprefill(?:s|ed|ing)?\b"),
    "decode": ("decode", r"(?i)\bdecode\b"),
    "roofline": ("roofline", r"(?i)\broofline\b"),
    "ridge point": ("ridge-point", r"(?i)\bridge\b"),
    "goodput": ("goodput", r"(?i)\bgoodput\b"),
    "paged attention": ("paged-attention", r"(?i)\bpaged ?attention\b"),
    "continuous batching": ("continuous-batching", r"(?i)\bcontinuous batching\b"),
    "speculative decoding": ("speculative-decoding", r"(?i)\bspeculative decoding\b"),
    "FLOP/byte": ("arithmetic-intensity", r"\bFLOP/byte\b"),
}


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: markup and punctuation dropped, lower case, spaces -> hyphens."""
    text = LINK.sub(r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def without_code_blocks(text: str) -> str:
    """The text with every fenced code block blanked (same length, so offsets still match)."""
    return re.sub(r"^```.*?^```", lambda m: re.sub(r"[^\n]", " ", m.group()), text, flags=re.M | re.S)


def anchors(path: Path) -> set[str]:
    """Every anchor of a markdown file: one per heading, a repeated one numbered as GitHub does (-1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for _, heading in HEADING.findall(without_code_blocks(path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def entries() -> list[tuple[str, str]]:
    """(heading, body) of each glossary term: every ### heading, and every ## heading that holds no ### under it."""
    text = without_code_blocks(GLOSSARY.read_text())
    marks = list(HEADING.finditer(text))
    found = []
    for i, m in enumerate(marks):
        level, body = len(m.group(1)), text[m.end():marks[i + 1].start() if i + 1 < len(marks) else len(text)]
        groups_terms = level == 2 and i + 1 < len(marks) and len(marks[i + 1].group(1)) == 3
        if level == 3 or (level == 2 and not groups_terms):
            found.append((m.group(2), body))
    return found


def relative_links(text: str) -> list[str]:
    return [target for _, target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def resolves(source: Path, target: str) -> Path | None:
    """The file a relative link points to, if it exists inside the repository."""
    path = target.split("#")[0]
    if not path:
        return source
    full = (source.parent / path).resolve()
    return full if full.exists() and (full == ROOT or ROOT in full.parents) else None


def glossary_links(source: Path) -> list[str]:
    """The anchors of every link from `source` to the glossary ('' for a link to the page itself)."""
    found = []
    for target in relative_links(source.read_text()):
        if resolves(source, target) == GLOSSARY.resolve() and (source != GLOSSARY or target.startswith("#")):
            found.append(target.partition("#")[2])
    return found


def test_the_glossary_has_its_terms_each_defined_with_a_file_that_exists():
    terms = entries()
    assert len(terms) >= 60, f"only {len(terms)} entries"
    names = [slug(h) for h, _ in terms]
    assert len(names) == len(set(names)), "a term is defined twice"
    for heading, body in terms:
        definition = body.split("Shown in:")[0]
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", " ".join(definition.split())) if len(s.split()) >= 3]
        assert sentences, f"{heading}: no definition"
        links = relative_links(body)
        assert links, f"{heading}: names no file of the repository"
        for target in links:
            assert resolves(GLOSSARY, target), f"{heading}: {target} does not exist"


def test_the_terms_the_brief_asks_for_are_all_defined():
    defined = {slug(h) for h, _ in entries()}
    wanted = ["token", "tokenizer", "bpe", "prompt", "prefill", "decode", "kv-cache", "logits", "sampling",
              "temperature", "top-k", "top-p", "greedy", "ttft", "itl", "tpot", "e2el", "goodput", "slo",
              "throughput", "latency", "batch", "static-batching", "continuous-batching", "chunked-prefill",
              "paged-attention", "block", "block-table", "prefix-caching", "preemption", "roofline",
              "arithmetic-intensity", "ridge-point", "memory-bound", "compute-bound", "gqa", "mqa", "head_dim",
              "rope", "rmsnorm", "swiglu", "quantization", "q4_1", "int8", "speculative-decoding", "draft",
              "acceptance-rate", "cuda-graph", "kernel", "flash-attention", "tensor-parallelism", "tail-latency",
              "quiet-machine", "spread"]
    assert not [w for w in wanted if w not in defined]
    body = dict((slug(h), b) for h, b in entries())["tensor-parallelism"]
    assert "../lessons/15_tensor_parallelism.py" in body, "tensor parallelism must point to the lesson that runs it"


def files_that_link_the_glossary() -> list[Path]:
    return sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", ROOT / "lessons" / "README.md",
                                                   ROOT / "notebooks" / "README.md"] \
        + sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))


@pytest.mark.parametrize("source", files_that_link_the_glossary(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_to_the_glossary_lands_on_a_heading(source):
    known = anchors(GLOSSARY)
    broken = [a for a in glossary_links(source) if a and a not in known]
    assert not broken, f"{source.relative_to(ROOT)} links to glossary anchors that do not exist: {broken}"


def test_links_from_the_glossary_and_reading_list_to_other_pages_land_on_headings():
    for source in (GLOSSARY, READING):
        for target in relative_links(source.read_text()):
            path, _, anchor = target.partition("#")
            file = resolves(source, target)
            assert file, f"{source.name}: broken link {target}"
            if anchor and file.suffix == ".md":
                assert anchor in anchors(file), f"{source.name}: no heading {anchor} in {path or source.name}"


def running_text(text: str) -> str:
    """The text with everything that cannot carry a link blanked: code blocks, headings, inline code, link targets,
    HTML tags and “quotes” copied from a transcript. Same length, so an offset means the same place in both."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group())
    text = without_code_blocks(text)
    text = re.sub(r"^#{1,6} .*$", blank, text, flags=re.M)
    text = re.sub(r"`[^`\n]*`", blank, text)
    text = re.sub(r"\]\([^)\s]+\)", lambda m: "]" + blank(m)[1:], text)
    text = re.sub(r"<[^>\n]+>", blank, text)
    return re.sub(r"“[^”]*”", blank, text)


def first_use(source: Path, pattern: str) -> tuple[int, str | None] | None:
    """Where a term is first used in running text, and the glossary anchor of the link around it (None: no link)."""
    raw = source.read_text()
    m = re.search(pattern, running_text(raw))
    if not m:
        return None
    for link in LINK.finditer(raw):
        if link.start(1) <= m.start() and m.end() <= link.end(1):
            file = resolves(source, link.group(2))
            on_glossary = file == GLOSSARY.resolve()
            return m.start(), (link.group(2).partition("#")[2] if on_glossary else None)
    return m.start(), None


@pytest.mark.parametrize("source", FIRST_USE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_first_use_of_each_key_term_links_to_its_glossary_entry(source):
    problems = []
    for term, (anchor, pattern) in KEY_TERMS.items():
        found = first_use(source, pattern)
        if found is None:
            continue
        offset, linked = found
        line = source.read_text().count("\n", 0, offset) + 1
        if linked != anchor:
            problems.append(f"line {line}: first use of {term!r} is not a link to glossary.md#{anchor}")
    assert not problems, f"{source.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_every_lesson_docstring_points_to_the_glossary_and_the_reading_list():
    for lesson in sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py")):
        docstring = re.match(r'\s*"""(.*?)"""', lesson.read_text(), re.S)
        assert docstring and "docs/glossary.md" in docstring.group(1) and "docs/reading.md" in docstring.group(1), \
            f"{lesson.name}: its docstring does not point to docs/glossary.md and docs/reading.md"


def test_every_reading_list_entry_names_a_lesson_that_exists():
    items = re.split(r"\n(?=- )", without_code_blocks(READING.read_text()))
    entries_ = [item for item in items if item.startswith("- ")]
    assert len(entries_) >= 20, f"only {len(entries_)} entries"
    for item in entries_:
        title = item.split("\n")[0][:80]
        lessons = [t for t in relative_links(item) if re.search(r"lessons/\d\d_\w+\.py$", t)]
        assert lessons, f"names no lesson: {title}"
        for target in lessons:
            assert resolves(READING, target), f"{title}: {target} does not exist"
        assert re.search(r"https?://", item), f"cites no address: {title}"
