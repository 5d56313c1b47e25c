"""Foundation: the default target model, core's independence from SGLang, lint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BLOCK_SGLANG = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "sglang" or name.startswith(("sglang.", "sgl_kernel")):
            raise ImportError("sglang is forbidden in core: " + name)
sys.meta_path.insert(0, Block())
import pkgutil, importlib, dflash_sglang.core as core
mods = [m.name for m in pkgutil.iter_modules(core.__path__, "dflash_sglang.core.")]
for m in mods:
    importlib.import_module(m)
print(len(mods))
"""


def test_core_imports_without_sglang() -> None:
    out = subprocess.run([sys.executable, "-c", BLOCK_SGLANG], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip()) >= 8  # every core module was imported


def test_the_block_really_blocks() -> None:
    code = BLOCK_SGLANG.replace("import pkgutil", "import sglang\nimport pkgutil")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0 and "forbidden" in out.stderr


def test_model_folder_loads_and_matches_fixture() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from dflash_sglang.models import FIXTURES, fetch_model

    path = fetch_model("smollm2-135m", log=lambda _m: None)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in cfg
    assert (path / "tokenizer.json").is_file() and (path / "chat_template.jinja").is_file()
    fx = json.loads((FIXTURES / "smollm2-135m_greedy.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        ids = torch.tensor([fx["prompt_ids"]])
        out = model.generate(
            ids,
            max_new_tokens=len(fx["output_ids"]),
            do_sample=False,
            attention_mask=torch.ones_like(ids),
            pad_token_id=0,
        )
    assert out[0, len(fx["prompt_ids"]) :].tolist() == fx["output_ids"]


def test_models_fetch_cli_is_fast_when_cached() -> None:
    import time

    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "dflash_sglang.cli", "models", "fetch", "smollm2-135m"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip().splitlines()[-1], "config.json").is_file()
    assert time.perf_counter() - t0 < 20


def test_ruff_clean() -> None:
    ruff = Path(sys.executable).with_name("ruff")
    assert ruff.exists(), "ruff missing: install the dev extra (pip install -e .[dev])"
    out = subprocess.run([str(ruff), "check", "."], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:]
