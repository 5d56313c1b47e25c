"""Draft/target compatibility from the two checkpoint folders alone (no weights loaded)."""

from __future__ import annotations

import json
from pathlib import Path

from ..core.config import DFlashConfig, DFlashConfigError, TargetSpec


def check_local_pair(target_path: str, draft_path: str | None) -> None:
    """Raise DFlashConfigError if a local drafter cannot serve a local target.

    Hub ids (not local folders) are left to the worker, which checks the loaded models again.
    """
    if not draft_path:
        raise DFlashConfigError("--speculative-draft-model-path is required with DFLASH")
    draft, target = Path(draft_path), Path(target_path)
    if not draft.is_dir() or not (target / "config.json").is_file():
        return
    cfg = DFlashConfig.from_pretrained(draft)
    if not any(draft.glob("*.safetensors")):
        raise DFlashConfigError(f"{draft}: no *.safetensors weights; point at a DFlash checkpoint folder")
    cfg.validate_against(_target_spec(target / "config.json"), needs_mask_id=False)


def _target_spec(config_json: Path) -> TargetSpec:
    d = json.loads(config_json.read_text())
    d = d.get("text_config") or d
    return TargetSpec(int(d["hidden_size"]), int(d["vocab_size"]), int(d["num_hidden_layers"]))
