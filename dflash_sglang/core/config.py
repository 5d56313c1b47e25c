"""DFlash draft checkpoint configuration, parsed once into a frozen dataclass.

The format is that of the published DFlash checkpoints (``architectures: ["DFlashDraftModel"]``):
Qwen3-style decoder fields at the top level, plus ``block_size``, ``num_target_layers`` and a
``dflash_config`` dict with ``target_layer_ids`` and ``mask_token_id`` (or ``mask_token``).
Every invalid case raises :class:`DFlashConfigError` with a one-line message naming the field
and what to do about it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DRAFT_ARCHITECTURE = "DFlashDraftModel"


class DFlashConfigError(ValueError):
    """A draft checkpoint or draft/target pairing that cannot work; the message says the fix."""


def default_target_layer_ids(num_target_layers: int, num_taps: int) -> tuple[int, ...]:
    """Tap layers spread over the target: one tap -> middle; n taps -> 1 .. L-3 evenly."""
    if num_taps < 1:
        raise DFlashConfigError(f"number of tap layers must be >= 1, got {num_taps}")
    if num_taps == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(round(1 + i * span / (num_taps - 1)) for i in range(num_taps))


@dataclass(frozen=True)
class TargetSpec:
    """What the drafter needs to know about its target model."""

    hidden_size: int
    vocab_size: int
    num_layers: int

    @classmethod
    def from_hf_config(cls, cfg: Any) -> TargetSpec:
        text = getattr(cfg, "text_config", None) or cfg
        return cls(int(text.hidden_size), int(text.vocab_size), int(text.num_hidden_layers))


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int
    block_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int | None  # None only while `mask_token` awaits a tokenizer
    mask_token: str | None = None
    layer_types: tuple[str, ...] = ()  # per draft layer: "full_attention" | "sliding_attention"
    sliding_window: int | None = None
    attention_bias: bool = False
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DFlashConfig:
        if not isinstance(d, dict):
            raise DFlashConfigError(
                f"config.json holds a {type(d).__name__}, not a JSON object; "
                "use a DFlash checkpoint's config.json"
            )
        archs = d.get("architectures") or []
        if archs and DRAFT_ARCHITECTURE not in archs:
            raise DFlashConfigError(
                f"architectures={archs}: not a DFlash drafter; expected {DRAFT_ARCHITECTURE!r} "
                "(pass a DFlash draft checkpoint as the draft model)"
            )
        dd: dict[str, Any] = d.get("dflash_config") or {}
        if not isinstance(dd, dict):
            raise DFlashConfigError(
                f"dflash_config={dd!r}: must be an object with target_layer_ids and mask_token_id"
            )

        def num(name: str, value: Any, kind: type = int) -> Any:
            try:
                if isinstance(value, bool) or (kind is int and float(value) != int(value)):
                    raise ValueError
                return kind(value)
            except (TypeError, ValueError, OverflowError):
                raise DFlashConfigError(f"{name}={value!r}: must be a number ({kind.__name__})") from None

        def need(name: str) -> int:
            if name not in d or d[name] is None:
                raise DFlashConfigError(f"config.json lacks {name!r}; add it (Qwen3-style drafter field)")
            return num(name, d[name])

        def pick(name: str, default: Any = None) -> Any:
            """dflash_config value, else the top-level one, else ``default`` (null counts as absent)."""
            value = dd.get(name)
            value = d.get(name) if value is None else value
            return default if value is None else value

        def opt(name: str, value: Any, kind: type = int) -> Any:
            return None if value is None else num(name, value, kind)

        def top(name: str, default: Any, kind: type = int) -> Any:
            return default if d.get(name) is None else num(name, d[name], kind)

        heads = need("num_attention_heads")
        hidden = need("hidden_size")
        layers = need("num_hidden_layers")
        num_target_layers = need("num_target_layers")
        taps = pick("target_layer_ids")
        if taps and not isinstance(taps, (list, tuple)):
            raise DFlashConfigError(f"dflash_config.target_layer_ids={taps!r}: must be a list of layer ids")
        taps = (tuple(num("dflash_config.target_layer_ids", t) for t in taps) if taps
                else default_target_layer_ids(num_target_layers, max(layers, 1)))
        layer_types = d.get("layer_types") or ()
        if not isinstance(layer_types, (list, tuple)):
            raise DFlashConfigError(f"layer_types={layer_types!r}: must be a list, one entry per draft layer")
        cfg = cls(
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=opt("num_key_value_heads", d.get("num_key_value_heads")) or heads,
            head_dim=opt("head_dim", d.get("head_dim")) or (hidden // heads if heads > 0 else 0),
            rms_norm_eps=top("rms_norm_eps", 1e-6, float),
            rope_theta=_rope_theta(d),
            max_position_embeddings=top("max_position_embeddings", 32768),
            vocab_size=need("vocab_size"),
            block_size=num("block_size", pick("block_size", 16)),
            num_target_layers=num_target_layers,
            target_layer_ids=taps,
            mask_token_id=opt("dflash_config.mask_token_id", pick("mask_token_id")),
            mask_token=pick("mask_token"),
            layer_types=tuple(str(t) for t in layer_types),
            sliding_window=top("sliding_window", None),
            attention_bias=bool(d.get("attention_bias", False)),
            input_embedding_scale=num("input_embedding_scale", pick("input_embedding_scale", 1.0) or 1.0,
                                      float),
            output_multiplier=num("output_multiplier", pick("output_multiplier", 1.0) or 1.0, float),
            final_logit_softcapping=_opt_float(
                opt("final_logit_softcapping", pick("final_logit_softcapping"), float)
            ),
            raw=dict(d),
        )
        cfg._check_self()
        return cfg

    @classmethod
    def from_pretrained(cls, path: str | Path) -> DFlashConfig:
        p = Path(path)
        f = p / "config.json" if p.is_dir() else p
        if not f.is_file():
            raise DFlashConfigError(f"{f}: no config.json; point --draft at a DFlash checkpoint folder")
        try:
            d = json.loads(f.read_text())
        except json.JSONDecodeError as e:
            raise DFlashConfigError(f"{f}: config.json is not valid JSON ({e.msg} at line {e.lineno})") from e
        return cls.from_dict(d)

    # --------------------------------------------------------------- validation
    def _check_self(self) -> None:
        def bad(name: str, value: Any, fix: str) -> DFlashConfigError:
            return DFlashConfigError(f"{name}={value!r}: {fix}")

        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size", "num_target_layers"):
            if getattr(self, name) < 1:
                raise bad(name, getattr(self, name), "must be a positive integer")
        if self.num_attention_heads % self.num_key_value_heads:
            raise bad("num_key_value_heads", self.num_key_value_heads,
                      f"must divide num_attention_heads={self.num_attention_heads}")
        if self.block_size < 1:
            raise bad("block_size", self.block_size, "must be >= 1 (16 for published drafters)")
        if self.mask_token_id is None and self.mask_token is None:
            raise bad("dflash_config.mask_token_id", None,
                      "set mask_token_id (or mask_token) in dflash_config")
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            raise bad("dflash_config.mask_token_id", self.mask_token_id,
                      f"must be a token id in [0, vocab_size={self.vocab_size})")
        if not self.target_layer_ids:
            raise bad("dflash_config.target_layer_ids", [], "list at least one target layer to tap")
        for t in self.target_layer_ids:
            if not 0 <= t < self.num_target_layers:
                raise bad("dflash_config.target_layer_ids", list(self.target_layer_ids),
                          f"every id must be in [0, num_target_layers={self.num_target_layers})")
        if self.layer_types:
            if len(self.layer_types) != self.num_hidden_layers:
                raise bad("layer_types", list(self.layer_types),
                          f"needs one entry per draft layer ({self.num_hidden_layers})")
            unknown = set(self.layer_types) - {"full_attention", "sliding_attention"}
            if unknown:
                raise bad("layer_types", sorted(unknown), "use 'full_attention' or 'sliding_attention'")
            if "sliding_attention" in self.layer_types and not self.sliding_window:
                raise bad("sliding_window", self.sliding_window, "sliding_attention layers need a window > 0")

    def validate_against(self, target: TargetSpec, needs_mask_id: bool = True) -> None:
        """Raise if this drafter cannot serve ``target`` (``needs_mask_id``: mask_token resolved)."""
        if self.hidden_size != target.hidden_size:
            raise DFlashConfigError(
                f"hidden_size: drafter has {self.hidden_size}, target has {target.hidden_size}; "
                "use a drafter trained for this target"
            )
        if self.vocab_size != target.vocab_size:
            raise DFlashConfigError(
                f"vocab_size: drafter has {self.vocab_size}, target has {target.vocab_size}; "
                "use a drafter trained for this target's tokenizer"
            )
        if max(self.target_layer_ids) >= target.num_layers:
            raise DFlashConfigError(
                f"dflash_config.target_layer_ids={list(self.target_layer_ids)}: the target has only "
                f"{target.num_layers} layers; use a drafter trained for this target"
            )
        if self.mask_token_id is None and needs_mask_id:
            raise DFlashConfigError("dflash_config.mask_token: unresolved; call with_tokenizer() first")

    def with_tokenizer(self, tokenizer: Any) -> DFlashConfig:
        """Resolve ``mask_token`` (a string) to an id with the target's tokenizer."""
        if self.mask_token_id is not None or self.mask_token is None:
            return self
        tid = tokenizer.convert_tokens_to_ids(self.mask_token)
        if tid is None or tid == getattr(tokenizer, "unk_token_id", -1):
            raise DFlashConfigError(
                f"dflash_config.mask_token={self.mask_token!r} is not in the target's vocabulary; "
                "set mask_token_id instead"
            )
        return _replace(self, mask_token_id=int(tid))

    def with_extra_layers(self, extra: int) -> DFlashConfig:
        """This config with ``extra`` more full-attention draft layers on top (train.grow)."""
        if extra < 1:
            raise DFlashConfigError(f"extra layers={extra}: grow by at least one layer")
        types = self.layer_types + ("full_attention",) * extra if self.layer_types else ()
        return _replace(self, num_hidden_layers=self.num_hidden_layers + extra, layer_types=types)

    # ------------------------------------------------------------------ helpers
    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    def layer_type(self, i: int) -> str:
        return self.layer_types[i] if self.layer_types else "full_attention"

    def to_dict(self) -> dict[str, Any]:
        """The published checkpoint format (what ``from_dict`` reads back)."""
        d = dict(self.raw)
        d.update(
            architectures=[DRAFT_ARCHITECTURE],
            model_type=d.get("model_type", "qwen3"),
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            max_position_embeddings=self.max_position_embeddings,
            vocab_size=self.vocab_size,
            block_size=self.block_size,
            num_target_layers=self.num_target_layers,
            attention_bias=self.attention_bias,
            hidden_act="silu",
            tie_word_embeddings=False,
        )
        if self.layer_types:
            d["layer_types"] = list(self.layer_types)
        if self.sliding_window is not None:
            d["sliding_window"] = self.sliding_window
        dd = dict(d.get("dflash_config") or {})
        dd.update(target_layer_ids=list(self.target_layer_ids), block_size=self.block_size)
        if self.mask_token_id is not None:
            dd["mask_token_id"] = self.mask_token_id
        for k in ("input_embedding_scale", "output_multiplier", "final_logit_softcapping"):
            if getattr(self, k) not in (None, 1.0):
                dd[k] = getattr(self, k)
        d["dflash_config"] = dd
        return d


def _replace(cfg: DFlashConfig, **changes: Any) -> DFlashConfig:
    d = asdict(cfg)
    d.update(changes)
    return DFlashConfig(**d)


def _opt_float(v: Any) -> float | None:
    return None if v is None or float(v) <= 0 else float(v)


def _rope_theta(d: dict[str, Any]) -> float:
    rp = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(rp, dict):
        raise DFlashConfigError(f"rope_parameters={rp!r}: must be an object with rope_type and rope_theta")
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type not in ("default", None):
        raise DFlashConfigError(
            f"rope_parameters.rope_type={rope_type!r}: only default RoPE is supported for drafters; "
            "retrain or convert the drafter with rope_type 'default'"
        )
    theta = d.get("rope_theta")
    theta = rp.get("rope_theta") if theta is None else theta
    try:
        value = 10000.0 if theta is None else float(theta)
    except (TypeError, ValueError):
        value = -1.0
    if not value > 0:
        raise DFlashConfigError(f"rope_theta={theta!r}: must be a positive number (10000.0 if unsure)")
    return value
