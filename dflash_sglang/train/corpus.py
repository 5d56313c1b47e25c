"""``dflash-sglang train-corpus``: a diverse training prompt corpus from non-evaluation sources.

Sources (installed by ``scripts/install_corpus_sources.sh``): German, French and Spanish man pages
(translate into English, summarise, extract), the Python 3.11 HTML documentation and the Debian
Reference (QA over a passage, explanation, extraction, summarisation of long passages, role-play,
writing, coding), the running interpreter's stdlib source (explain, implement from a docstring, find an
injected bug, type hints, docstrings, tests), WordNet word senses (STEM / humanities explanations,
writing topics, role-play personas, taxonomic reasoning) and GSM8K TRAIN (math word problems,
reasoning). No benchmark prompt (Spec-Bench, MT-Bench, HumanEval, GSM8K test, IFEval, MATH) is used.

Pipeline: extract units -> exact + near-duplicate removal over all units (first occurrence wins) ->
a seeded subsample per source -> templated prompts (:mod:`corpus_templates`) -> exact duplicate prompts
removed -> held-out split by source document (a hash of the document id) -> shuffled JSONL.gz files
plus ``manifest.json``. Rows: ``{"prompt", "task", "source", "doc", "split"}``; the output is a pure
function of the installed sources and the seed.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .corpus_sources import (
    LONG_CHARS,
    PASSAGE_CHARS,
    SOURCES,
    Unit,
    debian_copyright,
    debref_units,
    dpkg_version,
    gsm8k_units,
    interpreter_info,
    licence_of,
    man_units,
    python_doc_units,
    stdlib_root,
    stdlib_units,
    wordnet_units,
)
from .corpus_templates import TASKS, prompts_for
from .dedup import dedup, exact_key

HELDOUT_PERCENT = 4
# source -> (max units after dedup, prompts per unit)
PLAN: dict[str, tuple[int, int]] = {
    "manpages-de": (2500, 1), "manpages-fr": (2500, 1), "manpages-es": (2500, 1),
    "python3-doc": (7000, 2), "debian-reference-en": (1000, 2), "python-stdlib": (6000, 1),
    "wordnet-base": (10000, 1), "gsm8k-train": (8000, 1),
}


@dataclass(frozen=True)
class Row:
    prompt: str
    task: str
    source: str
    doc: str
    split: str

    def json(self) -> str:
        return json.dumps({"prompt": self.prompt, "task": self.task, "source": self.source, "doc": self.doc,
                           "split": self.split}, ensure_ascii=False)


def split_of(doc: str, heldout_percent: int = HELDOUT_PERCENT) -> str:
    """'heldout' for about heldout_percent % of documents: a hash of the document id alone (seed-free)."""
    h = int(hashlib.sha256(doc.encode()).hexdigest()[:8], 16)
    return "heldout" if h % 100 < heldout_percent else "train"


def extractors(gsm8k: Path) -> dict[str, Callable[[], Iterator[Unit]]]:
    return {"manpages-de": lambda: man_units("de"), "manpages-fr": lambda: man_units("fr"),
            "manpages-es": lambda: man_units("es"), "python3-doc": python_doc_units,
            "debian-reference-en": debref_units, "python-stdlib": stdlib_units,
            "wordnet-base": wordnet_units, "gsm8k-train": lambda: gsm8k_units(gsm8k)}


@dataclass
class SourceStats:
    units: int = 0
    exact_dups: int = 0
    near_dups: int = 0
    units_used: int = 0
    duplicate_prompts: int = 0


def subsample(units: list[Unit], cap: int, seed: int) -> list[Unit]:
    """At most cap units, chosen by a seeded hash of (doc, position in doc); original order kept."""
    if len(units) <= cap:
        return units
    pos = Counter[str]()
    scored = []
    for i, u in enumerate(units):
        pos[u.doc] += 1
        scored.append((hashlib.sha256(f"{seed}:{u.doc}:{pos[u.doc]}".encode()).digest(), i))
    chosen = sorted(i for _, i in sorted(scored)[:cap])
    return [units[i] for i in chosen]


def unit_prompts(units: Iterable[Unit], per_unit: int, seed: int) -> Iterator[tuple[Unit, str, str]]:
    """(unit, task, prompt); each unit's RNG is seeded by (seed, doc, its position in the doc)."""
    pos = Counter[str]()
    for u in units:
        pos[u.doc] += 1
        rng = random.Random(f"{seed}:{u.doc}:{pos[u.doc]}")
        for task, prompt in prompts_for(u, rng, per_unit):
            yield u, task, prompt


def build_rows(by_source: dict[str, list[Unit]], seed: int, plan: dict[str, tuple[int, int]],
               heldout_percent: int = HELDOUT_PERCENT) -> tuple[list[Row], dict[str, SourceStats]]:
    """Dedup over all sources (in the given order), subsample, template, drop repeated prompts, split."""
    names = list(by_source)
    flat = [(name, u) for name in names for u in by_source[name]]
    result = dedup([u.text for _, u in flat], seed=seed)
    stats = {name: SourceStats(units=len(by_source[name])) for name in names}
    for i in result.exact:
        stats[flat[i][0]].exact_dups += 1
    for i in result.near:
        stats[flat[i][0]].near_dups += 1
    kept: dict[str, list[Unit]] = {name: [] for name in names}
    for i in result.keep:
        kept[flat[i][0]].append(flat[i][1])
    rows: list[Row] = []
    seen: set[str] = set()
    for name in names:
        cap, per_unit = plan[name]
        used = subsample(kept[name], cap, seed)
        stats[name].units_used = len(used)
        for u, task, prompt in unit_prompts(used, per_unit, seed):
            key = exact_key(prompt)
            if key in seen:
                stats[name].duplicate_prompts += 1
                continue
            seen.add(key)
            rows.append(Row(prompt, task, name, u.doc, split_of(u.doc, heldout_percent)))
    random.Random(seed).shuffle(rows)
    return rows, stats


# ---------------------------------------------------------------------------------------------------------
# files

def write_jsonl_gz(path: Path, lines: Iterable[str]) -> None:
    """Deterministic gzip (mtime 0, no file name), written to a temporary name and renamed."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", filename="", mtime=0) as gz:
        with io.TextIOWrapper(gz, encoding="utf-8") as f:
            for line in lines:
                f.write(line + "\n")
    tmp.replace(path)


def load_corpus(path: str | Path) -> list[dict]:
    """Rows of a corpus file (.jsonl or .jsonl.gz)."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_meta(name: str, gsm8k: Path) -> dict:
    """Package, version and licence of one source (Debian copyright file, or the files themselves)."""
    if name == "python-stdlib":
        lic = stdlib_root() / "LICENSE.txt"
        return {"package": "python-stdlib (the running interpreter's standard library source tree)",
                "version": interpreter_info()["version"], "path": str(stdlib_root()),
                "licence": licence_of(lic.read_text(errors="replace")) if lic.is_file() else "PSF-2.0",
                "licence_file": str(lic)}
    if name == "gsm8k-train":
        return {"package": "gsm8k train split (openai/grade-school-math grade_school_math/data/train.jsonl)",
                "version": f"sha256:{sha256_file(gsm8k)[:16]}", "path": str(gsm8k),
                "licence": _readme_licence(gsm8k), "licence_file": str(gsm8k.parent / "README.md")}
    pkg = name
    cp = debian_copyright("python3.11-doc" if pkg == "python3-doc" else pkg)
    meta = {"package": pkg, "version": dpkg_version(pkg),
            "licence": licence_of(cp.read_text(errors="replace")),
            "licence_file": str(cp)}
    if pkg == "python3-doc":
        meta["content_package"] = f"python3.11-doc {dpkg_version('python3.11-doc')}"
    return meta


def _readme_licence(data_file: Path) -> str:
    readme = data_file.parent / "README.md"
    if readme.is_file():
        for line in readme.read_text().splitlines():
            if line.startswith(f"| {data_file.name} "):
                return line.strip().strip("|").split("|")[-1].strip()
    return "MIT"


def manifest(rows: list[Row], stats: dict[str, SourceStats], seed: int, gsm8k: Path,
             files: dict[str, Path]) -> dict:
    per_source = {}
    for name, st in stats.items():
        mine = [r for r in rows if r.source == name]
        per_source[name] = {
            **source_meta(name, gsm8k),
            "documents": len({r.doc for r in mine}),
            "heldout_documents": len({r.doc for r in mine if r.split == "heldout"}),
            "units_extracted": st.units,
            "dedup_removed": {"exact": st.exact_dups, "near": st.near_dups, "duplicate_prompts":
                              st.duplicate_prompts},
            "units_used": st.units_used,
            "prompts": len(mine),
            "prompts_heldout": sum(r.split == "heldout" for r in mine),
            "tasks": dict(sorted(Counter(r.task for r in mine).items())),
        }
    return {
        "seed": seed,
        "command": "dflash-sglang train-corpus --out data/corpus" + (f" --seed {seed}" if seed else ""),
        "prompts": len(rows),
        "splits": dict(sorted(Counter(r.split for r in rows).items())),
        "tasks": {t: sum(r.task == t for r in rows) for t in TASKS},
        "passage_chars": PASSAGE_CHARS, "long_passage_chars": LONG_CHARS,
        "heldout": f"by source document: sha256(doc) % 100 < {HELDOUT_PERCENT}",
        "tools": {"man-db": dpkg_version("man-db"), "groff-base": dpkg_version("groff-base"),
                  "python": sys.version.split()[0]},
        "sources": per_source,
        "files": {k: {"path": p.name, "sha256": sha256_file(p), "bytes": p.stat().st_size}
                  for k, p in files.items()},
    }


def build_corpus(out: str | Path, seed: int = 0, gsm8k: str | Path | None = None,
                 log: Callable[[str], None] = print) -> dict:
    """Extracts every source, builds the rows and writes train/heldout .jsonl.gz and manifest.json."""
    from ..prompts import shared_data_dir

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    gsm = Path(gsm8k) if gsm8k else shared_data_dir() / "gsm8k_train.jsonl"
    check_sources(gsm)
    ex = extractors(gsm)
    by_source = {}
    for s in SOURCES:
        by_source[s.name] = list(ex[s.name]())
        log(f"{s.name}: {len(by_source[s.name])} units")
    rows, stats = build_rows(by_source, seed, PLAN)
    files = {split: out / f"{split}.jsonl.gz" for split in ("train", "heldout")}
    for split, path in files.items():
        write_jsonl_gz(path, (r.json() for r in rows if r.split == split))
    m = manifest(rows, stats, seed, gsm, files)
    (out / "manifest.json").write_text(json.dumps(m, indent=1, ensure_ascii=False) + "\n")
    log(f"{len(rows)} prompts -> {out} ({m['splits']})")
    return m


def check_sources(gsm8k: Path) -> None:
    """One line naming what is missing, before minutes of extraction."""
    missing = [s.package for s in SOURCES if s.package not in ("python-stdlib", "gsm8k-train")
               and dpkg_version(s.package) is None]
    if missing:
        raise SystemExit(f"train-corpus: packages not installed: {' '.join(missing)}; "
                         f"run scripts/install_corpus_sources.sh (as root)")
    if not gsm8k.is_file():
        raise SystemExit(f"train-corpus: {gsm8k} not found (GSM8K train; pass --gsm8k)")
    if re.search(r"test", gsm8k.name, re.I):
        raise SystemExit(f"train-corpus: {gsm8k} looks like a test split; only GSM8K train is allowed")
