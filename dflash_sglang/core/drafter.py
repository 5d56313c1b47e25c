"""The DFlash drafter: Qwen3-style layers conditioned on tapped target hidden states.

Data flow (H = hidden size, T = number of tap layers):
  tap features [N, T*H] --fc--> [N, H] --hidden_norm--> context feature c
  every draft layer l projects c with ITS OWN k_proj/k_norm/v_proj (+RoPE at the context
  token's absolute position) into extra keys/values; those are cached once per committed token.
  A block [last committed token, mask x (B-1)] is embedded with the target's embedding, and each
  layer's queries come from the block only; keys/values are [context ; block], non-causal inside
  the block. The final norm output at block positions 1..B-1 goes through the target's LM head.
The drafter owns no embedding and no LM head: it borrows the target's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .config import DFlashConfig, DFlashConfigError
from .draft_head import VOCAB_FILE, load_draft_vocab, save_draft_vocab
from .layers import RMSNorm, apply_rope, masked_attention, rope_cos_sin, visibility_mask

# attend(layer index, q [..., n, h, d], k [..., n, kvh, d], v [..., n, kvh, d]) -> [..., n, h, d]
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ContextKV:
    """Per-layer draft keys/values of context tokens, padded per request."""

    keys: list[torch.Tensor]  # L x [bs, C, kvh, d]
    values: list[torch.Tensor]  # L x [bs, C, kvh, d]
    positions: torch.Tensor  # [bs, C] absolute positions
    valid: torch.Tensor  # [bs, C] bool; False = padding


class DraftAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig, layer_idx: int) -> None:
        super().__init__()
        h, kvh, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = h, kvh, d
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kvh * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kvh * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        sliding = cfg.layer_type(layer_idx) == "sliding_attention"
        # Published drafters: full-attention layers are non-causal, sliding layers causal, unless
        # config.json sets ``is_causal`` (an explicit null means "use that default", as upstream).
        is_causal = cfg.raw.get("is_causal")
        self.causal = sliding if is_causal is None else bool(is_causal)
        self.window = cfg.sliding_window if sliding else None
        self.scale = d**-0.5

    def project_kv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., n, H] -> k, v [..., n, kvh, d] (k normed and rotated)."""
        shape = (*x.shape[:-1], self.kv_heads, self.head_dim)
        k = apply_rope(self.k_norm(self.k_proj(x).view(shape)), cos, sin)
        return k, self.v_proj(x).view(shape)

    def project_qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [..., n, H] (input-normed) -> q [..., n, h, d], k, v [..., n, kvh, d] (q, k normed, rotated)."""
        q = self.q_norm(self.q_proj(x).view(*x.shape[:-1], self.heads, self.head_dim))
        k, v = self.project_kv(x, cos, sin)
        return apply_rope(q, cos, sin), k, v


class DraftMLP(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg.hidden_size, cfg.intermediate_size)


class DFlashDrafter(nn.Module):
    """Parameter names match the published checkpoints (``layers.N.self_attn.q_proj.weight`` ...)."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.num_taps * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # [V'] token ids the drafter may propose (``draft_vocab.json``; see core.draft_head); None: all
        self.draft_vocab: torch.Tensor | None = None

    # --------------------------------------------------------------- context
    def fuse_context(self, taps: torch.Tensor) -> torch.Tensor:
        """taps [..., T*H] (tap layers concatenated in config order) -> [..., H]."""
        return self.hidden_norm(self.fc(taps))

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, dtype)

    def context_kv(
        self, taps: torch.Tensor, positions: torch.Tensor
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """taps [..., n, T*H], positions [..., n] -> per layer k, v [..., n, kvh, d]."""
        c = self.fuse_context(taps)
        cos, sin = self.rope(positions, c.dtype)
        kv = [layer.self_attn.project_kv(c, cos, sin) for layer in self.layers]
        return [k for k, _ in kv], [v for _, v in kv]

    # ----------------------------------------------------------------- block
    def run_layers(self, block_embeds: torch.Tensor, block_positions: torch.Tensor,
                   attend: AttendFn) -> torch.Tensor:
        """The drafter's layer loop, the one place it is written (the reference engine, SGLang's model
        class and training all run it): block_embeds [..., n, H] (the target's, unscaled) and
        block_positions [..., n] -> final-normed hidden states [..., n, H]. ``attend(i, q, k, v)`` is
        layer i's attention over the block's own q [..., n, h, d] / k, v [..., n, kvh, d] (normed and
        rotated) plus whatever context the caller holds; it returns [..., n, h, d]."""
        x = block_embeds * self.cfg.input_embedding_scale
        cos, sin = self.rope(block_positions, x.dtype)
        for i, layer in enumerate(self.layers):
            a = layer.self_attn
            q, k, v = a.project_qkv(layer.input_layernorm(x), cos, sin)
            x = x + a.o_proj(attend(i, q, k, v).flatten(-2))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)

    def forward_block(
        self,
        block_embeds: torch.Tensor,  # [bs, B, H] target embeddings (unscaled)
        block_positions: torch.Tensor,  # [bs, B]
        ctx: ContextKV,
        block_valid: torch.Tensor | None = None,  # [bs, B] bool; False = right padding (None: all valid)
    ) -> torch.Tensor:
        """-> final-normed hidden states [bs, B, H] for every block position (in-memory context KV).
        Padding positions are no key for any query; their own outputs are meaningless."""
        if block_valid is None:
            block_valid = torch.ones_like(block_positions, dtype=torch.bool)
        k_pos = torch.cat([ctx.positions, block_positions], dim=1)
        k_valid = torch.cat([ctx.valid, block_valid], dim=1)
        masks: dict[tuple[bool, int | None], torch.Tensor] = {}

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            a = self.layers[i].self_attn
            key = (a.causal, a.window)
            if key not in masks:
                masks[key] = visibility_mask(block_positions, k_pos, k_valid, a.causal, a.window)
            keys, values = torch.cat([ctx.keys[i], k], dim=1), torch.cat([ctx.values[i], v], dim=1)
            return masked_attention(q, keys, values, masks[key], a.scale)

        return self.run_layers(block_embeds, block_positions, attend)

    def logits(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> logits [..., V] through the borrowed LM head."""
        out = F.linear(hidden, lm_head_weight) * self.cfg.output_multiplier
        cap = self.cfg.final_logit_softcapping
        return torch.tanh(out / cap) * cap if cap else out

    # ------------------------------------------------------------ checkpoint
    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
    ) -> DFlashDrafter:
        cfg = DFlashConfig.from_pretrained(path)
        model = cls(cfg)
        state = load_safetensors_dir(Path(path))
        model.load_published_state(state)
        model.draft_vocab = load_draft_vocab(path)
        return model.to(device=device, dtype=dtype).eval()

    def load_published_state(self, state: dict[str, torch.Tensor]) -> None:
        state = {_strip(k): v for k, v in state.items()}
        state = {k: v for k, v in state.items() if not k.startswith(("embed_tokens.", "lm_head."))}
        own = self.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise DFlashConfigError(
                f"draft weights do not match config.json: missing {missing[:3]}, "
                f"unexpected {unexpected[:3]}; "
                "re-export the checkpoint or fix num_hidden_layers/target_layer_ids"
            )
        for k, t in own.items():
            if state[k].shape != t.shape:
                raise DFlashConfigError(
                    f"draft weight {k} has shape {tuple(state[k].shape)}, config implies {tuple(t.shape)}; "
                    "config.json and weights disagree"
                )
        self.load_state_dict(state)

    def save_pretrained(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        from safetensors.torch import save_file

        p = Path(path)
        p.mkdir(parents=True, exist_ok=True)
        state = {k: (v.to(dtype) if dtype else v).contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(p / "model.safetensors"), metadata={"format": "pt"})
        cfg = self.cfg.to_dict()
        if dtype is not None:
            cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
        (p / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        if self.draft_vocab is not None:
            save_draft_vocab(p, self.draft_vocab)
        elif (p / VOCAB_FILE).is_file():
            (p / VOCAB_FILE).unlink()  # a stale subset must not outlive the weights it was made for


def _strip(name: str) -> str:
    return name.removeprefix("model.")


def load_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise DFlashConfigError(f"{path}: no *.safetensors weights; point at a DFlash checkpoint folder")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError) as e:
            raise DFlashConfigError(
                f"{f}: unreadable safetensors file ({e}); re-download or re-export it"
            ) from e
    return state
