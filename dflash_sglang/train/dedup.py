"""Exact and near-duplicate removal for text corpora (plain Python + numpy, deterministic).

Exact: a SHA-1 of the normalised text (NFKC, lower case, punctuation dropped, whitespace collapsed).
Near: MinHash signatures over word shingles with LSH banding; a text is a near duplicate when a text
kept before it shares an LSH band with it and their signatures agree on at least ``threshold`` of the
hash functions (an estimate of the shingle-set Jaccard similarity). The first occurrence always wins.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PRIME = 4294967291  # largest prime < 2**32: a * x + b stays below 2**64 for a, b, x < 2**32
WORD = re.compile(r"\w+")


def normalise(text: str) -> str:
    return " ".join(WORD.findall(unicodedata.normalize("NFKC", text).lower()))


def exact_key(text: str) -> str:
    return hashlib.sha1(normalise(text).encode()).hexdigest()


def shingles(text: str, k: int = 5) -> np.ndarray:
    """[S] uint64: CRC-32 of every k-word window of the normalised text (one window if shorter)."""
    words = normalise(text).split()
    grams = [" ".join(words[i: i + k]) for i in range(max(1, len(words) - k + 1))]
    return np.unique(np.array([zlib.crc32(g.encode()) for g in grams], dtype=np.uint64))


@dataclass(frozen=True)
class MinHasher:
    a: np.ndarray  # [K] uint64 in [1, PRIME)
    b: np.ndarray  # [K] uint64 in [0, PRIME)

    @classmethod
    def create(cls, num_perm: int = 64, seed: int = 0) -> MinHasher:
        rng = np.random.default_rng(seed)
        a = rng.integers(1, PRIME, num_perm, dtype=np.uint64)
        return cls(a, rng.integers(0, PRIME, num_perm, dtype=np.uint64))

    def signature(self, sh: np.ndarray) -> np.ndarray:
        """[S] shingle hashes -> [K] uint64 minimum of (a * x + b) mod PRIME over the shingles."""
        return ((sh[:, None] * self.a[None, :] + self.b[None, :]) % PRIME).min(axis=0)


@dataclass(frozen=True)
class DedupResult:
    keep: list[int]  # indices of the texts kept, ascending
    exact: list[int]  # indices removed as exact duplicates
    near: list[int]  # indices removed as near duplicates


def dedup(texts: Sequence[str], threshold: float = 0.7, bands: int = 16, rows: int = 4, shingle: int = 5,
          seed: int = 0) -> DedupResult:
    """First occurrence wins; exact duplicates first, then near duplicates among the remaining texts."""
    seen: set[str] = set()
    keep, exact, near = [], [], []
    hasher = MinHasher.create(bands * rows, seed)
    buckets: list[dict[bytes, list[int]]] = [{} for _ in range(bands)]  # band -> band bytes -> kept ids
    sigs: dict[int, np.ndarray] = {}
    for i, text in enumerate(texts):
        key = exact_key(text)
        if key in seen:
            exact.append(i)
            continue
        seen.add(key)
        sig = hasher.signature(shingles(text, shingle))
        parts = [sig[j * rows: (j + 1) * rows].tobytes() for j in range(bands)]
        cands = {c for j, p in enumerate(parts) for c in buckets[j].get(p, ())}
        if any(float((sigs[c] == sig).mean()) >= threshold for c in cands):
            near.append(i)
            continue
        keep.append(i)
        sigs[i] = sig
        for j, p in enumerate(parts):
            buckets[j].setdefault(p, []).append(i)
    return DedupResult(keep, exact, near)
