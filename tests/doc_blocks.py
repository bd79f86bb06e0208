"""The runnable blocks of the docs: a fenced bash block preceded by

    <!-- runnable: expect="<regex>" exit=<code> -->

(`expect` must match the block's combined output, `exit` defaults to 0). tests/e2e/test_doc_commands.py runs them;
a marker that is not followed by a bash block, or that has an attribute it does not know, is an error, so that a
typo never turns a runnable block into one that is silently skipped. The syntax shown in a code span or a code
block is not a marker."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"

_MARKER = re.compile(r"<!--\s*runnable:(?P<attrs>.*?)-->", re.S)
_ATTR = re.compile(r'\s*(?P<key>[a-z]+)=(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>\S+))')
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_BLOCK = re.compile(r"[ \t]*\n(?:[ \t]*\n)*```(?:bash|sh)[ \t]*\n(?P<body>.*?)\n```", re.S)


@dataclass(frozen=True)
class Block:
    """One runnable block: `body` is run with bash; `line` is the page line of its first command."""

    page: str
    line: int
    body: str
    expect: str
    exit: int

    @property
    def first_line(self) -> str:
        return next((x for x in self.body.splitlines() if x.strip()), "")


def _attrs(text: str, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text.rstrip()):
        m = _ATTR.match(text, pos)
        if m is None:
            raise ValueError(
                f"{where}: cannot read the runnable marker's attributes at {text[pos:].strip()!r}"
            )
        key = m.group("key")
        if key not in ("expect", "exit") or key in out:
            raise ValueError(f"{where}: runnable marker attribute {key!r} is unknown or given twice")
        value = m.group("quoted")
        out[key] = value.replace('\\"', '"') if value is not None else m.group("bare")
        pos = m.end()
    return out


def parse_blocks(text: str, page: str) -> list[Block]:
    """The runnable blocks of one page's Markdown `text`, in page order; ValueError naming the page and line of a
    malformed marker."""
    fences = [(m.start(), m.end()) for m in _FENCE.finditer(text)]
    blocks = []
    for marker in _MARKER.finditer(text):
        if text[max(marker.start() - 1, 0)] == "`" or any(a < marker.start() < b for a, b in fences):
            continue  # the syntax shown in a code span or a code block, not a marker
        line = text.count("\n", 0, marker.start()) + 1
        where = f"{page}:{line}"
        attrs = _attrs(marker.group("attrs"), where)
        if "expect" not in attrs:
            raise ValueError(f'{where}: a runnable marker needs expect="<regex>"')
        try:
            re.compile(attrs["expect"])
        except re.error as e:
            raise ValueError(f"{where}: expect is not a regex: {e}") from None
        if not re.fullmatch(r"\d+", attrs.get("exit", "0")):
            raise ValueError(f"{where}: exit must be a number, got {attrs['exit']!r}")
        block = _BLOCK.match(text, marker.end())
        if block is None:
            raise ValueError(f"{where}: a runnable marker must be followed by a ```bash block")
        blocks.append(
            Block(
                page=page,
                line=text.count("\n", 0, block.start("body")) + 1,
                body=block.group("body"),
                expect=attrs["expect"],
                exit=int(attrs.get("exit", "0")),
            )
        )
    return blocks


def pages_with_blocks(docs: Path = DOCS) -> dict[str, list[Block]]:
    """{page path relative to docs/: its runnable blocks} for every page that has one."""
    out = {}
    for path in sorted(docs.rglob("*.md")):
        page = str(path.relative_to(docs))
        blocks = parse_blocks(path.read_text(), page)
        if blocks:
            out[page] = blocks
    return out
