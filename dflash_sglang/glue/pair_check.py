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
    draft, target = Path(draft_path).expanduser(), Path(target_path)
    if _missing_local_folder(draft_path):
        raise DFlashConfigError(f"--speculative-draft-model-path {draft_path}: no such folder "
                                f"(looked in {Path.cwd()}; a model hub id has the form org/name)")
    if not draft.is_dir() or not (target / "config.json").is_file():
        return
    cfg = DFlashConfig.from_pretrained(draft)
    if not any(draft.glob("*.safetensors")):
        raise DFlashConfigError(f"{draft}: no *.safetensors weights; point at a DFlash checkpoint folder")
    cfg.validate_against(_target_spec(target / "config.json"), needs_mask_id=False)


def _missing_local_folder(path: str) -> bool:
    """True for a path meant as a local folder that is not one: a file, an absolute or ./ ~ path,
    anything but org/name, or org/name whose first part is a local folder (drafters/x)."""
    p = Path(path).expanduser()
    if p.is_dir():
        return False
    if p.exists() or p.is_absolute() or path.startswith((".", "~")) or path.count("/") != 1:
        return True
    return Path(path.split("/")[0]).is_dir()


def _target_spec(config_json: Path) -> TargetSpec:
    d = json.loads(config_json.read_text())
    d = d.get("text_config") or d
    return TargetSpec(int(d["hidden_size"]), int(d["vocab_size"]), int(d["num_hidden_layers"]))
