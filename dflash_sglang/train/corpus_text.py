"""Plain text out of the corpus sources: HTML -> headed blocks, rendered man pages -> sections, passages.

Everything here is a pure function of its input bytes (the man renderer aside, which runs ``man -l``
with a fixed width and locale), so the corpus built from it is deterministic.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

VOID_TAGS = frozenset({"br", "img", "meta", "link", "hr", "input", "col", "area", "base", "wbr", "source"})
BLOCK_TAGS = frozenset({"p", "pre", "li", "dt", "dd", "blockquote", "tr", "div", "section", "ul", "ol",
                        "dl", "table", "h1", "h2", "h3", "h4", "h5", "h6", "caption", "figcaption"})
HEADINGS = {f"h{i}": i for i in range(1, 7)}
Attrs = list[tuple[str, str | None]]
Matcher = Callable[[str, dict[str, str]], bool]


@dataclass(frozen=True)
class Block:
    text: str
    level: int = 0  # 0: body text; 1..6: a heading of that level
    pre: bool = False  # preformatted (code, screen output): line breaks kept


class _BlockParser(HTMLParser):
    """Collects text blocks inside the first element ``main`` accepts, leaving out ``skip`` subtrees."""

    def __init__(self, main: Matcher, skip: Matcher) -> None:
        super().__init__(convert_charrefs=True)
        self.main, self.skip = main, skip
        self.stack: list[str] = []  # open (non-void) tags
        self.main_depth: int | None = None  # stack depth of the main element while inside it
        self.skip_depth: int | None = None  # stack depth of the skipped subtree while inside it
        self.buf: list[str] = []
        self.blocks: list[Block] = []
        self.done = False

    def handle_starttag(self, tag: str, attrs: Attrs) -> None:
        if tag in VOID_TAGS:
            if tag == "br":
                self.buf.append("\n")
            return
        a = {k: v or "" for k, v in attrs}
        if tag in BLOCK_TAGS:
            self._flush()
        self.stack.append(tag)
        depth = len(self.stack)
        if self.main_depth is None and not self.done and self.main(tag, a):
            self.main_depth = depth
        elif self.main_depth is not None and self.skip_depth is None and self.skip(tag, a):
            self.skip_depth = depth

    def handle_startendtag(self, tag: str, attrs: Attrs) -> None:
        if tag == "br":
            self.buf.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID_TAGS or tag not in self.stack:
            return
        if tag in BLOCK_TAGS:
            self._flush()
        while self.stack:  # close up to and including the matching tag (tolerates unclosed children)
            depth = len(self.stack)
            if self.skip_depth == depth:
                self.skip_depth = None
            if self.main_depth == depth:
                self.main_depth, self.done = None, True
            if self.stack.pop() == tag:
                break

    def handle_data(self, data: str) -> None:
        if self.main_depth is not None and self.skip_depth is None:
            self.buf.append(data)

    def _flush(self) -> None:
        raw = "".join(self.buf)
        self.buf = []
        pre = "pre" in self.stack
        text = _clean_pre(raw) if pre else " ".join(raw.split())
        if not text:
            return
        level = next((HEADINGS[t] for t in reversed(self.stack) if t in HEADINGS), 0)
        self.blocks.append(Block(text, level, pre))


def _clean_pre(raw: str) -> str:
    lines = [ln.rstrip() for ln in raw.replace("\t", "    ").splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    return "\n".join(lines).rstrip()


def html_blocks(html: str, main: Matcher, skip: Matcher) -> list[Block]:
    p = _BlockParser(main, skip)
    p.feed(html)
    p.close()
    p._flush()
    return p.blocks


@dataclass(frozen=True)
class Section:
    title: str
    level: int  # heading level (1 = page title); 0 for text before any heading
    blocks: tuple[Block, ...]


def sections(blocks: Iterable[Block], max_level: int) -> list[Section]:
    """Cuts blocks at headings of level <= max_level; deeper headings stay inside as body text."""
    out: list[Section] = []
    title, level, cur = "", 0, []
    for b in blocks:
        if 0 < b.level <= max_level:
            if cur:
                out.append(Section(title, level, tuple(cur)))
            title, level, cur = strip_heading(b.text), b.level, []
        else:
            cur.append(b)
    if cur:
        out.append(Section(title, level, tuple(cur)))
    return out


def strip_heading(text: str) -> str:
    """'5.1. The basic network¶' -> 'The basic network'."""
    text = text.replace("¶", "").strip()
    return re.sub(r"^(\d+(\.\d+)*\.?|[A-Z]\.\d+(\.\d+)*\.?)\s+", "", text).strip()


def block_text(b: Block) -> str:
    return b.text if not b.level else strip_heading(b.text)


# ---------------------------------------------------------------------------------------------------------
# man pages

MAN_ENV = {"MANWIDTH": "2000", "LC_ALL": "C.UTF-8", "MAN_KEEP_FORMATTING": "", "PATH": "/usr/bin:/bin"}
OVERSTRIKE = re.compile(r".\x08")


def render_man(path: Path) -> str:
    """``man -l`` output of one page: no hyphenation or justification, one line per filled paragraph."""
    env = {**{k: v for k, v in os.environ.items() if k == "HOME"}, **MAN_ENV}
    r = subprocess.run(["man", "--nh", "--nj", "-E", "UTF-8", "-l", str(path)], capture_output=True,
                       env=env, timeout=60, check=False)
    return OVERSTRIKE.sub("", r.stdout.decode("utf-8", "replace"))


@dataclass(frozen=True)
class ManSection:
    title: str
    paragraphs: tuple[str, ...]


def man_sections(rendered: str) -> list[ManSection]:
    """Rendered page -> sections (headings start at column 0); header and footer lines dropped."""
    lines = [ln.rstrip() for ln in rendered.splitlines()]
    body = [i for i, ln in enumerate(lines) if ln.strip()]
    if len(body) < 3:
        return []
    lines = lines[body[0] + 1: body[-1]]  # the first and last non-empty lines are header and footer
    out: list[ManSection] = []
    title, paras, cur = "", [], []
    for ln in lines + [""]:
        if ln and not ln[0].isspace():
            paras = _close_para(paras, cur)
            if title or paras:
                out.append(ManSection(title, tuple(paras)))
            title, paras, cur = ln.strip(), [], []
        elif not ln.strip():
            paras, cur = _close_para(paras, cur), []
        else:
            cur.append(ln.strip())
    if title or paras:
        out.append(ManSection(title, tuple(paras)))
    return out


def _close_para(paras: list[str], cur: list[str]) -> list[str]:
    return paras + ["\n".join(cur)] if cur else paras


# ---------------------------------------------------------------------------------------------------------
# passages

def clip(text: str, limit: int) -> str:
    """text cut to <= limit characters, at a sentence end when one falls in the second half, else a space."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    ends = [m.end() for m in re.finditer(r"[.!?:;](\s|$)", head)]
    if ends and ends[-1] > limit // 2:
        return head[: ends[-1]].rstrip()
    cut = head.rfind(" ")
    return (head[:cut] if cut > limit // 2 else head).rstrip()


def pack(paragraphs: Iterable[str], limit: int, min_len: int) -> list[str]:
    """Greedy: consecutive paragraphs joined by blank lines into passages of <= limit characters.

    A paragraph longer than limit is clipped and stands alone; passages shorter than min_len are dropped."""
    out: list[str] = []
    cur = ""
    for p in paragraphs:
        p = clip(p.strip(), limit)
        if not p:
            continue
        if cur and len(cur) + 2 + len(p) > limit:
            out.append(cur)
            cur = ""
        cur = f"{cur}\n\n{p}" if cur else p
    if cur:
        out.append(cur)
    return [p for p in out if len(p) >= min_len]


STOPWORDS = frozenset("""a about above after again against all also an and any are as at be because
been before
being below between both but by can could did do does doing down during each either else every few for from
further had has have having here how however if in into is it its itself just may might more most much must
no nor not now of off on once only or other our out over own same shall should since so some such than that
the their them then there these they this those through to too under until up upon use used uses using very
via was we were what when where whether which while who whom why will with within without would you your
example examples following default value values file files true false none return returns see also new one
two three first second section chapter note""".split())
TERM = re.compile(r"[A-Za-z_][\w.\-]*[A-Za-z0-9_]")


def salient_terms(text: str, k: int = 3) -> list[str]:
    """Up to k frequent non-stopword terms (>= 4 characters), by count then first occurrence."""
    counts: dict[str, int] = {}
    first: dict[str, str] = {}
    for m in TERM.finditer(text):
        word = m.group(0)
        key = word.lower()
        if len(key) < 4 or key in STOPWORDS or key.isdigit():
            continue
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, word)
    order = sorted(counts, key=lambda w: -counts[w])  # stable: ties keep first-occurrence order
    return [first[w] for w in order[:k]]
