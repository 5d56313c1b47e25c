"""SGLang's built-in drafter class loads our committed checkpoint exactly, read as our code reads it.

SGLang 0.5.23 ships ``sglang.srt.models.dflash.DFlashDraftModel``, which serves published DFlash
checkpoints without our plugin. This test is the oracle that ``drafters/smollm2-135m-dflash-b16``
is such a checkpoint: in a subprocess (SGLang's distributed / runtime-context globals must not
leak into other tests) it builds the built-in model on CPU at TP 1, feeds ``load_weights`` the
(name, tensor) pairs SGLang's default loader would (``safetensors_weights_iterator``, names as
stored) and reports

* per checkpoint tensor, loaded alone into a NaN-filled model: which parameter elements it wrote
  (so a tensor that ``load_weights`` skips silently writes nothing and is caught), and whether they
  hold the tensor verbatim;
* per parameter, after one ``load_weights`` call with the whole checkpoint: elements left unwritten
  or written twice, and equality with the value built from our tensors (``qkv_proj`` =
  cat(q, k, v), ``gate_up_proj`` = cat(gate, up), every other parameter under its own name);
* what the built-in model read from ``config.json`` (block size, taps, mask token, attention).

A copy of the checkpoint with ``q_proj`` renamed is the negative control: the same script must
report the tensor ignored and ``qkv_proj`` partly unloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_sglang.core.config import DFlashConfig
from dflash_sglang.core.drafter import DFlashDrafter

DRAFTER = Path(__file__).resolve().parents[2] / "drafters" / "smollm2-135m-dflash-b16"
RENAMED_FROM = "layers.0.self_attn.q_proj.weight"
RENAMED_TO = "layers.0.self_attn.q_projX.weight"
FUSED = {  # built-in parameter -> our tensors, concatenated along dim 0 in this order
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}

# Run as `python script.py FUSED_JSON DIR [DIR ...]`; prints one `RESULT {json}` line per directory.
SCRIPT = r'''
import json, os, socket, sys, traceback

import torch

torch.set_num_threads(1)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")

from safetensors.torch import load_file
from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
from sglang.srt.model_loader.utils import set_default_torch_dtype
from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator
from sglang.srt.models.dflash import DFlashDraftModel
from sglang.srt.utils.hf_transformers_utils import get_config
from sglang.test.test_utils import publish_build_topology

init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                             distributed_init_method=f"tcp://127.0.0.1:{port}")
publish_build_topology(tp_size=1, ep_size=1, pp_size=1, device="cpu")
initialize_model_parallel(backend="gloo")

FUSED = json.loads(sys.argv[1])


def expected_params(ckpt, param_names):
    """Built-in parameter name -> value built from our tensors (None when a source is absent)."""
    out = {}
    for pname in param_names:
        parent, _, leaf = pname.rpartition(".")
        module, _, attr = parent.rpartition(".")
        if attr in FUSED:
            srcs = [f"{module}.{src}.{leaf}" for src in FUSED[attr]]
            out[pname] = torch.cat([ckpt[s] for s in srcs]) if all(s in ckpt for s in srcs) else None
        else:
            out[pname] = ckpt.get(pname)
    return out


def probe(drafter_dir):
    config = get_config(drafter_dir, trust_remote_code=False)  # what ModelConfig reads
    with set_default_torch_dtype(torch.bfloat16), torch.device("cpu"):  # as the default loader does
        model = DFlashDraftModel(config)
    params = dict(model.named_parameters())
    st_file = os.path.join(drafter_dir, "model.safetensors")
    ckpt = load_file(st_file)

    def reset():
        for p in params.values():
            p.data.fill_(float("nan"))

    # 1. Each tensor alone: which parameter elements does it write, and are they the tensor verbatim?
    tensors, writes = {}, {n: torch.zeros(p.shape, dtype=torch.int32) for n, p in params.items()}
    for name, tensor in safetensors_weights_iterator([st_file]):
        reset()
        model.load_weights([(name, tensor)])
        targets = {n: ~p.detach().isnan() for n, p in params.items()}
        targets = {n: m for n, m in targets.items() if bool(m.any())}
        for n, m in targets.items():
            writes[n] += m.to(torch.int32)
        verbatim = len(targets) == 1 and all(
            torch.equal(params[n].detach()[m], tensor.flatten().to(params[n].dtype))
            for n, m in targets.items()
        )
        tensors[name] = {
            "numel": tensor.numel(), "dtype": str(tensor.dtype), "finite": bool(tensor.isfinite().all()),
            "targets": sorted(targets), "written": int(sum(int(m.sum()) for m in targets.values())),
            "verbatim": verbatim,
        }

    # 2. The whole checkpoint in one call, as the loader does; compare with values built from our tensors.
    reset()
    model.load_weights(safetensors_weights_iterator([st_file]))
    expected = expected_params(ckpt, params)
    out_params = {}
    for n, p in params.items():
        value, want = p.detach(), expected[n]
        out_params[n] = {
            "shape": list(value.shape), "dtype": str(value.dtype),
            "unwritten": int((writes[n] == 0).sum()), "overwritten": int((writes[n] > 1).sum()),
            "nan_after_load": int(value.isnan().sum()),
            "equal_expected": want is not None and want.shape == value.shape and torch.equal(value, want),
        }

    attn = model.layers[0].self_attn
    dc = model.draft_config
    num_target_layers = dc.num_target_layers or max(dc.target_layer_ids) + 1
    read = {
        "block_size": model.block_size, "config_block_size": dc.block_size,
        "target_layer_ids": dc.resolve_target_layer_ids(target_num_layers=num_target_layers,
                                                        draft_num_layers=len(model.layers)),
        "num_target_layers": dc.num_target_layers, "num_context_features": model.num_context_features,
        "mask_token_id": dc.mask_token_id, "num_layers": len(model.layers),
        "num_heads": attn.num_heads, "num_kv_heads": attn.num_kv_heads, "head_dim": attn.head_dim,
        "rope_base": float(attn.rotary_emb.base), "rms_norm_eps": float(model.norm.variance_epsilon),
        "layers": [{"attn_type": layer.self_attn.attn_type.name,
                    "sliding_window": layer.self_attn.sliding_window_size} for layer in model.layers],
    }
    return {"dir": drafter_dir, "tensors": tensors, "params": out_params, "read": read,
            "ignored_tensors": sorted(n for n, t in tensors.items() if not t["targets"]),
            "missing_params": sorted(n for n, p in out_params.items() if p["unwritten"])}


for drafter_dir in sys.argv[2:]:
    try:
        result = probe(drafter_dir)
    except Exception:
        result = {"dir": drafter_dir, "error": traceback.format_exc()}
    print("RESULT " + json.dumps(result), flush=True)
'''


@pytest.fixture(scope="module")
def renamed_drafter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Our checkpoint with one tensor renamed: the built-in loader skips it without a word."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("renamed") / "drafter"
    out.mkdir()
    shutil.copy(DRAFTER / "config.json", out / "config.json")
    state = load_file(DRAFTER / "model.safetensors")
    state[RENAMED_TO] = state.pop(RENAMED_FROM)
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def results(renamed_drafter: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """One subprocess probes both checkpoints (SGLang's import and setup dominate the run time)."""
    script = tmp_path_factory.mktemp("probe") / "probe_builtin_loader.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "SGLANG_PLATFORM": "dflash_cpu", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, str(script), json.dumps(FUSED), str(DRAFTER), str(renamed_drafter)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    lines = [line[len("RESULT "):] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    log = f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0 and len(lines) == 2, log
    out = {}
    for line in lines:
        res = json.loads(line)
        assert "error" not in res, f"{res['dir']}:\n{res.get('error')}"
        out["ours" if res["dir"] == str(DRAFTER) else "renamed"] = res
    return out


def _expected_sources() -> dict[str, list[str]]:
    """Built-in parameter -> the names of our tensors it must hold (from our own drafter's layout)."""
    ours = DFlashDrafter(DFlashConfig.from_pretrained(DRAFTER))
    sources: dict[str, list[str]] = {}
    for name in ours.state_dict():
        parent, _, leaf = name.rpartition(".")
        module, _, attr = parent.rpartition(".")
        fused = next((f for f, parts in FUSED.items() if attr in parts), None)
        sources.setdefault(f"{module}.{fused}.{leaf}" if fused else name, []).append(name)
    return sources


def test_builtin_model_loads_every_tensor_of_our_checkpoint(results: dict[str, dict]) -> None:
    from safetensors import safe_open

    res = results["ours"]
    with safe_open(DRAFTER / "model.safetensors", "pt") as f:
        ours = set(f.keys())
    # Checkpoint side: every tensor landed, whole and verbatim, in exactly one built-in parameter.
    assert set(res["tensors"]) == ours
    assert res["ignored_tensors"] == []
    for name, t in res["tensors"].items():
        assert t["dtype"] == "torch.bfloat16" and t["finite"], name
        assert len(t["targets"]) == 1 and t["written"] == t["numel"] and t["verbatim"], (name, t)
    # Model side: every element of every parameter written exactly once, equal to our values.
    assert res["missing_params"] == []
    for name, p in res["params"].items():
        assert p["dtype"] == "torch.bfloat16", (name, p)
        assert p["unwritten"] == 0 and p["overwritten"] == 0 and p["nan_after_load"] == 0, (name, p)
        assert p["equal_expected"], (name, p)
    # The pairing is the one our drafter's own layout implies, and no parameter is left over.
    sources = _expected_sources()
    assert set(res["params"]) == set(sources)
    for pname, srcs in sources.items():
        assert sorted(t for t, v in res["tensors"].items() if v["targets"] == [pname]) == sorted(srcs), pname
    assert res["params"]["layers.0.self_attn.qkv_proj.weight"]["shape"] == [576 + 2 * 192, 576]
    assert res["params"]["layers.0.mlp.gate_up_proj.weight"]["shape"] == [2 * 1536, 576]


def test_builtin_model_reads_our_config_as_we_do(results: dict[str, dict]) -> None:
    cfg = DFlashConfig.from_pretrained(DRAFTER)
    read = results["ours"]["read"]
    assert read["block_size"] == read["config_block_size"] == cfg.block_size == 16
    assert read["target_layer_ids"] == list(cfg.target_layer_ids)
    assert read["num_target_layers"] == cfg.num_target_layers
    assert read["num_context_features"] == cfg.num_taps == len(cfg.target_layer_ids)
    assert cfg.mask_token_id is not None and read["mask_token_id"] == cfg.mask_token_id
    assert read["num_layers"] == cfg.num_hidden_layers
    assert (read["num_heads"], read["num_kv_heads"], read["head_dim"]) == (
        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
    assert read["rope_base"] == cfg.rope_theta
    assert read["rms_norm_eps"] == pytest.approx(cfg.rms_norm_eps, rel=1e-12)
    # Attention inside a block: ours is non-causal full attention (or causal sliding) per layer.
    ours = DFlashDrafter(cfg)
    want = [{"attn_type": "DECODER" if layer.self_attn.causal else "ENCODER_ONLY",
             "sliding_window": layer.self_attn.window or -1} for layer in ours.layers]
    assert read["layers"] == want


def test_negative_control_renamed_tensor_is_reported(results: dict[str, dict]) -> None:
    res = results["renamed"]
    assert res["ignored_tensors"] == [RENAMED_TO]
    assert res["missing_params"] == ["layers.0.self_attn.qkv_proj.weight"]
    qkv = res["params"]["layers.0.self_attn.qkv_proj.weight"]
    assert qkv["unwritten"] == 576 * 576 and not qkv["equal_expected"]
    others = {n: p for n, p in res["params"].items() if n != "layers.0.self_attn.qkv_proj.weight"}
    assert all(p["unwritten"] == 0 and p["equal_expected"] for p in others.values())
