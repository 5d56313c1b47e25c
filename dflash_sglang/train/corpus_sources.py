"""The corpus sources: Debian packages, the running interpreter's stdlib and GSM8K train, as text units.

A :class:`Unit` is one piece of source content (a passage, a function, a word sense, a word problem)
with the fields the prompt templates fill in. Every unit names its source document (``doc``); the
held-out split is made by document. Each extractor walks its files in sorted order, so its output is a
pure function of the installed files.
"""

from __future__ import annotations

import ast
import gzip
import inspect
import json
import re
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .corpus_text import (
    Block,
    block_text,
    clip,
    html_blocks,
    man_sections,
    pack,
    render_man,
    salient_terms,
    sections,
)

PASSAGE_CHARS = 1200  # every passage, code unit and question is at most this long ...
LONG_CHARS = 2500  # ... except long passages, used for summarisation only
LONG_MIN_CHARS = 1600


@dataclass(frozen=True)
class Unit:
    source: str  # manifest source name, e.g. "manpages-de"
    doc: str  # source document id: the held-out split is made by it
    kind: str  # template set: foreign | prose | code | concept | math
    text: str  # the content itself (the dedup key)
    fields: dict[str, str] = field(default_factory=dict)  # template fields besides {text}
    long: bool = False  # a long passage (<= LONG_CHARS): summarisation only


@dataclass(frozen=True)
class Source:
    name: str  # manifest name
    package: str  # Debian package (or a description of where the files come from)
    kind: str


SOURCES = (
    Source("manpages-de", "manpages-de", "foreign"),
    Source("manpages-fr", "manpages-fr", "foreign"),
    Source("manpages-es", "manpages-es", "foreign"),
    Source("python3-doc", "python3-doc", "prose"),
    Source("debian-reference-en", "debian-reference-en", "prose"),
    Source("python-stdlib", "python-stdlib", "code"),
    Source("wordnet-base", "wordnet-base", "concept"),
    Source("gsm8k-train", "gsm8k-train", "math"),
)
LANGUAGES = {"de": "German", "fr": "French", "es": "Spanish"}


# ---------------------------------------------------------------------------------------------------------
# package metadata

def dpkg_files(package: str) -> list[Path]:
    r = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True, check=False)
    return sorted(Path(p) for p in r.stdout.splitlines() if p.strip())


def dpkg_version(package: str) -> str | None:
    r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True,
                       check=False)
    return r.stdout.strip() or None


def licence_of(copyright_text: str) -> str:
    """Licence short names of a Debian copyright file (DEP-5 ``License:`` lines), else its known title."""
    names: list[str] = []
    for m in re.finditer(r"^License:[ \t]*(\S[^\n]*)$", copyright_text, re.M):
        name = m.group(1).strip()
        if name not in names:
            names.append(name)
    if names:
        return " AND ".join(names)
    if "PSF LICENSE AGREEMENT" in copyright_text or "PYTHON SOFTWARE FOUNDATION LICENSE" in copyright_text:
        return "PSF-2.0 (Python Software Foundation License)"
    return "unknown (see copyright file)"


def debian_copyright(package: str) -> Path:
    return Path("/usr/share/doc") / package / "copyright"


# ---------------------------------------------------------------------------------------------------------
# man pages (de / fr / es): passages for "translate into English" and friends

MAN_SKIP = re.compile(r"^(BEZEICHNUNG|NAME|NOM|NOMBRE|ÜBERSICHT|SYNOPSIS|SINOPSIS|SIEHE AUCH|VOIR AUSSI|"
                      r"V[EÉ]ASE TAMBI[EÉ]N|VEA TAMBI[EÉ]N|AUTOR(EN)?|AUTHORS?|AUTEURS?|AUTORES|COPYRIGHT|"
                      r"ÜBERSETZUNG|TRADUCTION|TRADUCCI[OÓ]N|KOLOPHON|COLOPHON|FEHLER MELDEN|"
                      r"FEHLER BERICHTEN|SIGNALER DES BOGUES|INFORMAR DE ERRORES|REPORTING BUGS)\b", re.I)


def man_pages(lang: str) -> list[Path]:
    root = f"/usr/share/man/{lang}/"
    return [p for p in dpkg_files(f"manpages-{lang}") if str(p).startswith(root) and p.name.endswith(".gz")
            and p.is_file() and not p.is_symlink()]


def man_units(lang: str, long_every: int = 4) -> Iterator[Unit]:
    """Per page: passages of the body sections; every ``long_every``-th page gives one long passage."""
    source, language = f"manpages-{lang}", LANGUAGES[lang]
    for n, path in enumerate(man_pages(lang)):
        secs = [s for i, s in enumerate(man_sections(render_man(path)))
                if i >= 2 and not MAN_SKIP.match(s.title)]
        paras = [p for s in secs for p in s.paragraphs]
        title = path.name.removesuffix(".gz").rsplit(".", 1)[0]
        doc = f"{source}:{path.parent.name}/{path.name}"
        fields = {"lang": language, "title": title}
        if n % long_every == 0 and sum(len(p) for p in paras) >= LONG_MIN_CHARS:
            long = pack(paras, LONG_CHARS, LONG_MIN_CHARS)[:1]
            yield from (Unit(source, doc, "foreign", t, fields, long=True) for t in long)
            continue
        for text in pack(paras, PASSAGE_CHARS, 150):
            yield Unit(source, doc, "foreign", text, fields)


# ---------------------------------------------------------------------------------------------------------
# HTML prose: the Python documentation and the Debian Reference

PY_DOC_ROOT = Path("/usr/share/doc/python3.11/html")
PY_DOC_SKIP = re.compile(r"^(genindex|py-modindex|search|contents|index|copyright|license|bugs|about|"
                         r"download|glossary)")
DEBREF_ROOT = Path("/usr/share/debian-reference")


def _py_main(tag: str, a: dict[str, str]) -> bool:
    return tag == "div" and a.get("role") == "main"


def _py_skip(tag: str, a: dict[str, str]) -> bool:
    return "headerlink" in a.get("class", "").split() or tag in ("script", "style")


def _debref_main(tag: str, a: dict[str, str]) -> bool:
    return tag == "body"


def _debref_skip(tag: str, a: dict[str, str]) -> bool:
    boxes = ("toc", "navheader", "navfooter", "table", "list-of-tables", "informaltable")
    return tag in ("script", "style") or (tag == "div" and a.get("class", "") in boxes)


def python_doc_files() -> list[Path]:
    return sorted(p for p in PY_DOC_ROOT.rglob("*.html")
                  if not p.relative_to(PY_DOC_ROOT).parts[0].startswith("_")
                  and not PY_DOC_SKIP.match(p.relative_to(PY_DOC_ROOT).as_posix()))


def python_doc_units() -> Iterator[Unit]:
    """One document per HTML page; passages per top-level section, a long passage from every 3rd one."""
    for path in python_doc_files():
        rel = path.relative_to(PY_DOC_ROOT).as_posix()
        blocks = html_blocks(path.read_text(encoding="utf-8"), _py_main, _py_skip)
        page = next((block_text(b) for b in blocks if b.level == 1), rel)
        doc = f"python3-doc:{rel}"
        base = {"topic": "the Python documentation", "things": "function, class, module and parameter name",
                "program": "Python", "persona": "an experienced Python developer",
                "asker": "junior colleague", "page": page}
        yield from _prose_units("python3-doc", doc, blocks, base, max_level=2)


def debref_units() -> Iterator[Unit]:
    """One document per top-level section (``5.1.``) of a chapter."""
    for path in sorted(DEBREF_ROOT.glob("*.en.html")):
        if path.name.startswith("index"):
            continue
        blocks = html_blocks(path.read_text(encoding="utf-8"), _debref_main, _debref_skip)
        base = {"topic": "the Debian Reference manual", "things": "command, package and file name",
                "program": "shell (bash)", "persona": "a Debian system administrator", "asker": "new user"}
        for k, sec in enumerate(sections(blocks, max_level=2)):
            doc = f"debian-reference-en:{path.name}#{k}"
            yield from _prose_units("debian-reference-en", doc, list(sec.blocks), {**base, "page": sec.title},
                                    max_level=3, heading=sec.title)


def _prose_units(source: str, doc: str, blocks: list[Block], base: dict[str, str], max_level: int,
                 heading: str = "") -> Iterator[Unit]:
    for k, sec in enumerate(sections(blocks, max_level)):
        paras = [block_text(b) for b in sec.blocks if len(b.text) >= 40 or b.pre]
        title = sec.title or heading or base["page"]
        fields = {**base, "title": title}
        if k % 3 == 1 and sum(len(p) for p in paras) >= LONG_MIN_CHARS:
            for text in pack(paras, LONG_CHARS, LONG_MIN_CHARS)[:1]:
                yield Unit(source, doc, "prose", text, fields, long=True)
            continue
        for text in pack(paras, PASSAGE_CHARS, 250):
            yield Unit(source, doc, "prose", text, _with_terms(fields, text))


def _with_terms(fields: dict[str, str], text: str) -> dict[str, str]:
    terms = salient_terms(text, 1)
    return {**fields, "term": terms[0]} if terms else fields


# ---------------------------------------------------------------------------------------------------------
# Python source: functions and classes with docstrings from the running interpreter's stdlib

STDLIB_SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__", "_bundled",
                              "encodings", "lib2to3", "turtledemo", "__phello__", "pydoc_data"})


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        if STDLIB_SKIP_DIRS.isdisjoint(rel[:-1]) and not rel[-1].startswith("test_") and \
                not rel[0].startswith("config-"):
            out.append(p)
    return out


def stdlib_units(root: Path | None = None) -> Iterator[Unit]:
    """Functions, methods and small classes with a docstring, 150..1200 characters of source each."""
    root = root or stdlib_root()
    for path in stdlib_files(root):
        rel = path.relative_to(root).as_posix()
        source = path.read_bytes().decode("utf-8", "replace")
        tree = _parse(source)
        if tree is None:
            continue
        module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        lines = source.splitlines()
        for node, owner in _defs(tree):
            unit = code_unit(lines, node, owner, module, f"python-stdlib:{rel}")
            if unit is not None:
                yield unit


def _parse(source: str) -> ast.Module | None:
    try:  # a few stdlib files are deliberately not valid for this interpreter (e.g. bad-syntax fixtures)
        return ast.parse(source)
    except SyntaxError:
        return None


Def = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _defs(tree: ast.Module) -> Iterator[tuple[Def, str]]:
    """Module-level functions and classes, and the methods of module-level classes (with their class)."""
    for node in tree.body:
        if isinstance(node, Def):
            yield node, ""
        if isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield sub, node.name


def code_unit(lines: list[str], node: Def, owner: str, module: str, doc: str) -> Unit | None:
    """lines: the file's source lines; node spans lines[lineno - 1 : end_lineno] (decorators excluded)."""
    docstring = ast.get_docstring(node)
    if not docstring or node.end_lineno is None:
        return None
    code = textwrap.dedent("\n".join(lines[node.lineno - 1: node.end_lineno]))
    if not 150 <= len(code) <= PASSAGE_CHARS or code.count("\n") < 3 or _parse(code) is None:
        return None  # _parse: a string literal at column 0 inside a method defeats dedent
    summary = inspect.cleandoc(docstring).split("\n\n")[0].replace("\n", " ").strip()
    is_class = isinstance(node, ast.ClassDef)
    what = "class" if is_class else ("method" if owner else "function")
    fields = {"name": node.name, "module": module, "what": what, "owner": owner}
    if len(summary) >= 25:
        fields["summary"] = clip(summary, 400)
        if what == "function":
            fields["sigline"] = f"def {node.name}({ast.unparse(node.args)})"
    if not is_class and not _annotated(node):
        fields["unannotated"] = code
    bare = _without_docstring(code, node)
    if bare:
        fields["bare"] = bare
    return Unit("python-stdlib", doc, "code", code, fields)


def _annotated(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    a = node.args
    args = a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]
    return node.returns is not None or any(x.annotation is not None for x in args)


def _without_docstring(code: str, node: Def) -> str | None:
    """The code with its docstring lines removed, when something is left of the body."""
    if len(node.body) < 2:
        return None
    first = node.body[0]
    lines = code.splitlines()
    lo, hi = first.lineno - node.lineno, (first.end_lineno or first.lineno) - node.lineno
    if hi >= len(lines):
        return None
    return "\n".join(lines[:lo] + lines[hi + 1:])


# ---------------------------------------------------------------------------------------------------------
# WordNet: word senses with glosses, hypernyms, co-hyponyms, topic domains

WORDNET_ROOT = Path("/usr/share/wordnet")
LEXNAMES = ("adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute noun.body "
            "noun.cognition noun.communication noun.event noun.feeling noun.food noun.group noun.location "
            "noun.motive noun.object noun.person noun.phenomenon noun.plant noun.possession noun.process "
            "noun.quantity noun.relation noun.shape noun.state noun.substance noun.time "
            "verb.body verb.change "
            "verb.cognition verb.communication verb.competition verb.consumption verb.contact verb.creation "
            "verb.emotion verb.motion verb.perception verb.possession verb.social verb.stative verb.weather "
            "adj.ppl").split()
WN_POS = {"noun": "n", "verb": "v", "adj": "a"}


@dataclass(frozen=True)
class Synset:
    key: str  # pos + offset, e.g. "n00217014"
    words: tuple[str, ...]
    lexname: str
    gloss: str  # the definition, without the quoted examples
    examples: tuple[str, ...]
    hypernyms: tuple[str, ...]  # synset keys
    hyponyms: tuple[str, ...]
    domains: tuple[str, ...]  # topic-domain synset keys (";c")


def parse_synset(line: str, pos: str) -> Synset:
    head, _, gloss = line.partition(" | ")
    t = head.split()
    nw = int(t[3], 16)
    words = tuple(w.replace("_", " ") for w in t[4: 4 + 2 * nw: 2])
    i = 4 + 2 * nw
    ptrs = [t[i + 1 + 4 * k: i + 5 + 4 * k] for k in range(int(t[i]))]  # symbol, offset, pos, src/tgt

    def rel(*symbols: str) -> tuple[str, ...]:
        return tuple(f"{p[2].replace('s', 'a')}{p[1]}" for p in ptrs if p[0] in symbols)

    definition, *examples = [g.strip().strip('"') for g in gloss.strip().split(';')]
    return Synset(f"{pos}{t[0]}", words, LEXNAMES[int(t[1])], definition, tuple(e for e in examples if e),
                  rel("@", "@i"), rel("~", "~i"), rel(";c"))


def read_wordnet(root: Path = WORDNET_ROOT) -> dict[str, Synset]:
    out: dict[str, Synset] = {}
    for name, pos in WN_POS.items():
        for line in (root / f"data.{name}").read_text(encoding="latin-1").splitlines():
            if line and not line.startswith("  "):
                s = parse_synset(line, pos)
                out[s.key] = s
    return out


def familiar_senses(root: Path = WORDNET_ROOT) -> list[tuple[str, str]]:
    """(lemma, synset key) for lemmas seen in the sense-tagged corpus (tagsense_cnt > 0).

    Each such lemma's first sense.
    """
    out: list[tuple[str, str]] = []
    for name, pos in WN_POS.items():
        for line in (root / f"index.{name}").read_text(encoding="latin-1").splitlines():
            if not line or line.startswith("  "):
                continue
            t = line.split()
            p_cnt = int(t[3])
            tagged = int(t[5 + p_cnt])
            if tagged > 0 and re.fullmatch(r"[a-z][a-z_\-]*[a-z]", t[0]):
                out.append((t[0].replace("_", " "), f"{pos}{t[6 + p_cnt]}"))
    return out


def wordnet_units(root: Path = WORDNET_ROOT) -> Iterator[Unit]:
    """One unit per familiar synset (first familiar lemma wins), one document per synset."""
    wn = read_wordnet(root)
    seen: set[str] = set()
    units: list[Unit] = []
    for lemma, key in familiar_senses(root):
        syn = wn.get(key)
        if syn is None or key in seen or len(syn.gloss) < 15:
            continue
        seen.add(key)
        units.append(Unit("wordnet-base", f"wordnet:{key}", "concept", f"{lemma}: {syn.gloss}",
                          concept_fields(lemma, syn, wn)))
    yield from with_odd_one_out(units)


def with_odd_one_out(units: list[Unit]) -> list[Unit]:
    """Units with 3 co-hyponyms get ``odd``: them plus a noun of another category, in a hashed order."""
    nouns = [u for u in units if u.fields["pos"] == "noun"]
    out = []
    for i, u in enumerate(units):
        if "siblings" in u.fields and nouns:
            start = (i * 7919 + 13) % len(nouns)
            other = next((v for v in nouns[start:] + nouns[:start]
                          if v.fields["category"] != u.fields["category"]), None)
            if other is not None:
                words = u.fields["siblings"].split(", ") + [other.fields["word"]]
                k = int(u.doc.rsplit(":", 1)[1][1:]) % 4
                words = words[k:] + words[:k]
                u = Unit(u.source, u.doc, u.kind, u.text,
                         {**u.fields, "odd": ", ".join(words), "outsider": other.fields["word"]})
        out.append(u)
    return out


def concept_fields(lemma: str, syn: Synset, wn: dict[str, Synset]) -> dict[str, str]:
    pos, cat = syn.lexname.split(".")
    f = {"word": lemma, "gloss": syn.gloss, "a_word": _article(lemma), "category": cat, "pos": pos}
    if syn.examples:
        f["example"] = syn.examples[0]
    hyper = [wn[h] for h in syn.hypernyms if h in wn]
    if hyper and pos == "noun":
        f["hyper"] = hyper[0].words[0]
        sibs = [wn[k].words[0] for k in hyper[0].hyponyms if k in wn and k != syn.key]
        sibs = [s for s in sibs if s.lower() != lemma and s.islower()]
        if sibs:
            f["sibling"] = sibs[int(syn.key[1:]) % len(sibs)]
        if len(sibs) >= 3:
            f["siblings"] = ", ".join(sibs[:3])
    dom = [wn[d].words[0] for d in syn.domains if d in wn]
    if dom:
        f["domain"] = dom[0]
    return f


def _article(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


# ---------------------------------------------------------------------------------------------------------
# GSM8K train (never the test split)

def gsm8k_units(path: Path) -> Iterator[Unit]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for i, row in enumerate(rows):
        q = " ".join(row["question"].split())
        answer = row.get("answer", "").rsplit("####", 1)[-1].strip().replace(",", "")
        fields = {"answer": answer} if re.fullmatch(r"-?\d+(\.\d+)?", answer) else {}
        yield Unit("gsm8k-train", f"gsm8k-train:{i}", "math", q, fields)


def interpreter_info() -> dict[str, str]:
    return {"version": sys.version.split()[0], "prefix": sys.base_prefix, "stdlib": str(stdlib_root())}
