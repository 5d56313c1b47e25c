"""A compact, append-only self-distillation store: the target's greedy answers as token ids only.

Layout of a store folder::

    store.json            what produced the answers (target hashes, dtype, answer length, EOS ids)
    shard_00000.npz       ids [N] uint16: prompt + answer ids of every row, concatenated
                          offset, prompt_len, total_len [R] int64; key [R] uint64; row [R] int64
    shard_00001.npz ...

Row r of a shard is ``ids[offset[r] : offset[r] + total_len[r]]`` with its first ``prompt_len[r]`` ids
the chat-templated prompt; ``key`` is the first 8 bytes of sha256(prompt text) and ``row`` the corpus
row it came from. Shards are written to a temporary file and hard-linked into place (never over an
existing shard), so a shard on disk is always complete; a later run reads the keys already answered,
skips those prompts and appends new shards. The ids are the data (about 2 bytes per token). Tap
features are a local cache beside them (5.8 KB per token for SmolLM2's five taps; never committed)::

    taps_<l1>-<l2>-.../shard_00000.npy   [N, T*H] bf16 bits as int16, row i = taps of ids[i]
                                         (the last id of each row has none: zeros)

written by the distill run that computed them anyway, or rebuilt from the ids by :meth:`fill_taps`
(one batched prefill per group of rows, no decode loop). Labels for blocks anchored in the prompts
(``train --prompt-anchors``, see ``train.prompt_labels``) are small and committed beside the shards::

    shard_00000.greedy.npy   [sum of prompt_len] ids: per row, the target's greedy next token after
                             each prefix of its prompt, rows concatenated in shard order
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..core.target import HFTarget
from .data import Sample, online_taps, padded_groups
from .prompt_labels import prompt_greedy

STORE_FORMAT = 1
SHARD = re.compile(r"^shard_(\d{5})\.npz$")
COMPAT_KEYS = ("format", "target_config_sha256", "target_weights_sha256", "tokenizer_sha256", "dtype",
               "max_new_tokens", "eos_token_ids", "id_dtype")


@dataclass(frozen=True)
class StoredSample:
    ids: np.ndarray  # [total_len] token ids (the store's id dtype): prompt + answer
    prompt_len: int
    key: int  # prompt_key(prompt text)
    row: int  # corpus row the prompt came from (-1: unknown)

    def to_sample(self) -> Sample:
        """A training sample with no cached taps (``--features online`` style)."""
        return Sample(torch.from_numpy(self.ids.astype(np.int64)), self.prompt_len, None)


def prompt_key(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")


def id_dtype_for(vocab_size: int) -> str:
    return "uint16" if vocab_size <= np.iinfo(np.uint16).max + 1 else "uint32"


class DistillStore:
    """One store folder. ``create_or_open`` checks that ``meta`` matches what produced the store."""

    def __init__(self, root: Path, meta: dict) -> None:
        self.root, self.meta = root, meta
        self.id_dtype = np.dtype(meta["id_dtype"])

    @classmethod
    def open(cls, root: str | Path) -> DistillStore:
        root = Path(root)
        path = root / "store.json"
        if not path.is_file():
            raise SystemExit(f"{root}: not a distill store (no store.json)")
        return cls(root, json.loads(path.read_text()))

    @classmethod
    def create_or_open(cls, root: str | Path, meta: dict) -> DistillStore:
        root = Path(root)
        meta = {"format": STORE_FORMAT, **meta}
        path = root / "store.json"
        if path.is_file():
            have = json.loads(path.read_text())
            diff = [k for k in COMPAT_KEYS if have.get(k) != meta.get(k)]
            if diff:
                raise SystemExit(f"{root}: store was made with different {', '.join(diff)} "
                                 f"({', '.join(f'{k}={have.get(k)}' for k in diff)}); use another --out")
            return cls(root, have)
        root.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, (json.dumps(meta, indent=1) + "\n").encode())
        return cls(root, meta)

    def shard_paths(self) -> list[Path]:
        return sorted(p for p in self.root.iterdir() if SHARD.match(p.name))

    def keys(self) -> set[int]:
        return {int(k) for p in self.shard_paths() for k in _load(p)["key"]}

    def samples(self) -> list[StoredSample]:
        return [s for p in self.shard_paths() for s in read_shard(p)]

    def stats(self) -> dict[str, int]:
        n_seq = n_tok = n_ans = 0
        for p in self.shard_paths():
            z = _load(p)
            n_seq += len(z["key"])
            n_tok += int(z["total_len"].sum())
            n_ans += int((z["total_len"] - z["prompt_len"]).sum())
        return {"shards": len(self.shard_paths()), "sequences": n_seq, "tokens": n_tok,
                "answer_tokens": n_ans}

    # ------------------------------------------------------------------------ tap cache
    def taps_dir(self, layers: Sequence[int]) -> Path:
        return self.root / ("taps_" + "-".join(str(int(i)) for i in layers))

    def taps_path(self, shard: Path, layers: Sequence[int]) -> Path:
        return self.taps_dir(layers) / (shard.stem + ".npy")

    def write_taps(self, shard: Path, layers: Sequence[int], taps: Sequence[torch.Tensor]) -> Path:
        """taps: per row of ``shard``, [total_len - 1, T*H] (any float dtype) -> the shard's taps file."""
        z = _load(shard)
        n, width = len(z["ids"]), taps[0].shape[-1]
        out = np.zeros((n, width), dtype=np.int16)
        if len(taps) != len(z["offset"]):
            raise ValueError(f"{shard.name}: {len(taps)} tap arrays for {len(z['offset'])} rows")
        for o, t, x in zip(z["offset"], z["total_len"], taps, strict=True):
            if x.shape != (t - 1, width):
                raise ValueError(f"{shard.name}: taps {tuple(x.shape)} for a row of {t} ids")
            out[o: o + t - 1] = x.to(torch.bfloat16).view(torch.int16).numpy()
        path = self.taps_path(shard, layers)
        path.parent.mkdir(exist_ok=True)
        _save_npy(path, out)
        return path

    def fill_taps(self, target: HFTarget, max_tokens: int = 8192, log=None) -> int:
        """Writes the missing tap files for ``target.tap_layer_ids`` from the stored ids (batched
        prefill, rows grouped up to ``max_tokens`` padded tokens). -> number of shards filled."""
        filled = 0
        for shard in self.shard_paths():
            if self.taps_path(shard, target.tap_layer_ids).is_file():
                continue
            rows = read_shard(shard)
            taps: list[torch.Tensor | None] = [None] * len(rows)
            for group in padded_groups([len(r.ids) for r in rows], max_tokens):
                for j, t in zip(group, recompute_taps(target, [rows[g] for g in group]), strict=True):
                    taps[j] = t
            self.write_taps(shard, target.tap_layer_ids, taps)  # type: ignore[arg-type]
            filled += 1
            if log:
                log(f"taps: {shard.name} ({len(rows)} rows) filled")
        return filled

    # ------------------------------------------------------------------------ prompt labels
    @staticmethod
    def greedy_path(shard: Path) -> Path:
        return shard.with_name(shard.stem + ".greedy.npy")

    def fill_prompt_greedy(self, target: HFTarget, log=None) -> int:
        """Writes the missing ``shard_*.greedy.npy`` files (one batched prefill of the prompts, fp32
        as the target is loaded) -> number of shards filled. A row whose greedy token after the whole
        prompt is not its stored first answer token is counted in the log (batched-numerics ties)."""
        filled = 0
        for shard in self.shard_paths():
            path = self.greedy_path(shard)
            if path.is_file():
                continue
            rows = read_shard(shard)
            greedy = prompt_greedy(target, [r.ids[: r.prompt_len] for r in rows])
            off = sum(int(g[-1] != r.ids[r.prompt_len]) for g, r in zip(greedy, rows, strict=True)
                      if r.prompt_len < len(r.ids))
            flat = np.concatenate(greedy).astype(self.id_dtype)
            _save_npy(path, flat)
            filled += 1
            if log:
                log(f"prompt labels: {shard.name} ({len(rows)} rows, {len(flat)} prompt tokens; "
                    f"{off} rows whose greedy first answer token differs from the stored one)")
        return filled

    def training_samples(self, layers: Sequence[int]) -> list[Sample]:
        """Every stored row as a training sample whose taps are views into the memory-mapped tap files
        (bf16 [total_len - 1, T*H]); raises when a shard has no tap file (see :meth:`fill_taps`). Rows
        of shards with a greedy file carry their prompt labels (``Sample.greedy``)."""
        out: list[Sample] = []
        for shard in self.shard_paths():
            path = self.taps_path(shard, layers)
            if not path.is_file():
                raise FileNotFoundError(f"{path}: no tap features for {shard.name}; run fill_taps first")
            with warnings.catch_warnings():  # read-only memory map: nothing writes to these tensors
                warnings.simplefilter("ignore", UserWarning)
                taps = torch.from_numpy(np.load(path, mmap_mode="r")).view(torch.bfloat16)
            z = _load(shard)
            gpath = self.greedy_path(shard)
            greedy = np.load(gpath) if gpath.is_file() else None
            if greedy is not None and len(greedy) != int(z["prompt_len"].sum()):
                raise ValueError(f"{gpath}: {len(greedy)} labels for {int(z['prompt_len'].sum())} prompt ids")
            g_off = 0
            for o, t, p in zip(z["offset"], z["total_len"], z["prompt_len"], strict=True):
                ids = torch.from_numpy(z["ids"][o: o + t].astype(np.int64))
                g = None if greedy is None else torch.from_numpy(greedy[g_off: g_off + p].astype(np.int64))
                g_off += int(p)
                out.append(Sample(ids, int(p), taps[o: o + t - 1], g))
        return out

    def append(self, rows: Sequence[tuple[Sequence[int], int, int, int]]) -> Path:
        """Writes one new shard of (ids, prompt_len, key, row) rows; returns its path."""
        arrays = pack_rows(rows, self.id_dtype)
        tmp = self.root / f".shard.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        n = max((int(SHARD.match(p.name).group(1)) for p in self.shard_paths()), default=-1) + 1
        while True:  # link never replaces a shard another writer put there first
            dst = self.root / f"shard_{n:05d}.npz"
            try:
                os.link(tmp, dst)
                break
            except FileExistsError:
                n += 1
        tmp.unlink()
        return dst


def pack_rows(rows: Iterable[tuple[Sequence[int], int, int, int]],
              id_dtype: np.dtype) -> dict[str, np.ndarray]:
    ids, offset, plen, total, key, row = [], [], [], [], [], []
    pos = 0
    for seq, p, k, r in rows:
        if not 0 < p <= len(seq):
            raise ValueError(f"prompt_len {p} outside (0, {len(seq)}]")
        ids.append(np.asarray(seq, dtype=np.int64))
        offset.append(pos)
        plen.append(p)
        total.append(len(seq))
        key.append(k)
        row.append(r)
        pos += len(seq)
    flat = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    if flat.size and (flat.min() < 0 or flat.max() > np.iinfo(id_dtype).max):
        raise ValueError(f"token ids do not fit {id_dtype}")
    return {"ids": flat.astype(id_dtype), "offset": np.array(offset, np.int64),
            "prompt_len": np.array(plen, np.int64), "total_len": np.array(total, np.int64),
            "key": np.array(key, np.uint64), "row": np.array(row, np.int64)}


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def read_shard(path: Path) -> list[StoredSample]:
    z = _load(path)
    ends = z["offset"] + z["total_len"]
    if len(ends) and (ends[-1] != len(z["ids"]) or np.any(z["offset"][1:] != ends[:-1])):
        raise ValueError(f"{path}: index does not tile the ids")
    return [StoredSample(z["ids"][o: o + t], int(p), int(k), int(r))
            for o, t, p, k, r in zip(z["offset"], z["total_len"], z["prompt_len"], z["key"], z["row"],
                                     strict=True)]


def _save_npy(path: Path, arr: np.ndarray) -> None:
    """``arr`` as ``path`` (.npy), written to a temporary file first: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.save(f, arr)
    tmp.replace(path)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def target_meta(folder: str | Path, dtype: str, max_new_tokens: int, eos: Sequence[int],
                vocab_size: int) -> dict:
    """What identifies the answers: hashes of the target's config, weights and tokenizer, and settings."""
    d = Path(folder)
    weights = sorted(d.glob("*.safetensors"))
    names = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
    toks = [d / n for n in names if (d / n).is_file()]
    return {"target": d.name, "target_config_sha256": file_sha256(d / "config.json"),
            "target_weights_sha256": _hash_of(weights), "tokenizer_sha256": _hash_of(toks), "dtype": dtype,
            "max_new_tokens": max_new_tokens, "eos_token_ids": sorted(int(e) for e in eos),
            "id_dtype": id_dtype_for(vocab_size), "decoding": "greedy, chat template, batched left-padded"}


def _hash_of(files: Sequence[Path]) -> str:
    return hashlib.sha256("".join(f"{f.name}:{file_sha256(f)}" for f in files).encode()).hexdigest()


@torch.no_grad()
def recompute_taps(target: HFTarget, samples: Sequence[StoredSample]) -> list[torch.Tensor]:
    """Tap features [total_len - 1, T*H] of each sample: one batched prefill over all of them (no decode)."""
    return online_taps(target, [s.to_sample() for s in samples])
