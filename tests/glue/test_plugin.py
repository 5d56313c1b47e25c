"""The SGLang seams our plugin uses exist with the expected shapes in the pinned SGLang."""

from __future__ import annotations

import inspect

import pytest
import torch

from dflash_sglang.glue import plugin
from dflash_sglang.glue.batch_math import committed_rows, extend_positions, make_block, sampling_from_sglang


def test_pinned_sglang_version() -> None:
    import sglang

    from dflash_sglang.patches_guard import PINNED_SGLANG, check_sglang_version

    assert sglang.__version__ == PINNED_SGLANG
    check_sglang_version()


def test_create_worker_target_exists_with_expected_signature() -> None:
    import pkgutil

    owner, attr = plugin.CREATE_WORKER.rsplit(".", 1)
    fn = getattr(pkgutil.resolve_name(owner), attr)
    assert list(inspect.signature(fn).parameters) == ["self", "server_args"]


def test_handle_dflash_target_exists_with_expected_signature() -> None:
    import pkgutil

    owner, attr = plugin.HANDLE_DFLASH.rsplit(".", 1)
    fn = getattr(pkgutil.resolve_name(owner), attr)
    assert list(inspect.signature(fn).parameters) == ["server_args"]


def test_sglang_contracts_the_worker_relies_on() -> None:
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput
    from sglang.srt.speculative.draft_worker_common import build_draft_tp_worker, make_draft_input_v2

    fields = set(GenerationBatchResult.__dataclass_fields__)
    assert {"next_token_ids", "accept_lens", "next_draft_input", "new_seq_lens",
            "speculative_num_draft_tokens", "can_run_cuda_graph", "logits_output"} <= fields
    assert {"draft_token", "positions", "draft_token_num", "capture_hidden_mode",
            "live_seq_lens_cpu"} <= set(DFlashVerifyInput.__dataclass_fields__)
    assert list(inspect.signature(DFlashVerifyInput.prepare_for_verify).parameters)[:3] == \
        ["self", "batch", "target_worker"]
    assert {"server_args", "gpu_id", "nccl_port", "target_model_config", "algo_label",
            "attention_backend_override"} <= set(inspect.signature(build_draft_tp_worker).parameters)
    assert list(inspect.signature(make_draft_input_v2).parameters) == ["bonus_tokens", "new_seq_lens"]
    assert hasattr(BaseSpecWorker, "weight_update_runners")
    assert "DFlashDraftModel" in ModelRegistry.models


def test_worker_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from dflash_sglang.glue.worker import DFlashWorker

    def original(algo, *_a, **_k):
        return "builtin"

    from dflash_sglang.settings import reload_settings

    monkeypatch.delenv(plugin.WORKER_ENV, raising=False)
    reload_settings()
    assert plugin.create_worker_hook(original, SpeculativeAlgorithm.DFLASH, None) is DFlashWorker
    assert plugin.create_worker_hook(original, SpeculativeAlgorithm.NGRAM, None) == "builtin"
    monkeypatch.setenv(plugin.WORKER_ENV, "builtin")
    reload_settings()
    assert plugin.create_worker_hook(original, SpeculativeAlgorithm.DFLASH, None) == "builtin"
    monkeypatch.setenv(plugin.WORKER_ENV, "typo")
    with pytest.raises(ValueError, match="DFLASH_SGLANG_WORKER"):
        reload_settings()


def test_draft_model_registered_in_registry() -> None:
    from sglang.srt.models.registry import ModelRegistry

    from dflash_sglang.glue.sglang_drafter import DFlashDraftModel

    plugin.register_draft_model()
    assert ModelRegistry.models["DFlashDraftModel"] is DFlashDraftModel


def test_make_block_reads_reserved_slots() -> None:
    req_to_token = torch.arange(40).view(4, 10) + 100
    block = make_block(torch.tensor([7, 8]), torch.tensor([3, 5]), torch.tensor([2, 0]), req_to_token,
                       mask_id=0, nb=4)
    assert block.tokens.tolist() == [[7, 0, 0, 0], [8, 0, 0, 0]]
    assert block.positions.tolist() == [[3, 4, 5, 6], [5, 6, 7, 8]]
    assert block.slots.tolist() == [[123, 124, 125, 126], [105, 106, 107, 108]]


def test_extend_positions_follow_prefixes() -> None:
    got = extend_positions([0, 5, 2], [3, 2, 1], torch.device("cpu"))
    assert got.tolist() == [0, 1, 2, 5, 6, 2]


def test_committed_rows() -> None:
    assert committed_rows(torch.tensor([1, 3]), 4).tolist() == [[True, False, False, False],
                                                               [True, True, True, False]]


def test_sampling_from_sglang_marks_greedy_rows() -> None:
    class Info:
        is_all_greedy = False
        temperatures = torch.tensor([[1.0], [0.7]])
        top_ks = torch.tensor([1, 1 << 30], dtype=torch.int32)
        top_ps = torch.tensor([1.0, 0.9])
        min_ps = torch.tensor([0.0, 0.1])
        need_min_p_sampling = False
        need_top_p_sampling = True  # row 1's top_p 0.9
        need_top_k_sampling = True  # row 0's top_k 1 (SGLang's greedy row)

    cfg = sampling_from_sglang(Info(), 2, torch.device("cpu"))
    assert cfg.temperature.tolist() == [0.0, pytest.approx(0.7)]
    assert cfg.top_k.tolist() == [1, 0] and cfg.top_p.tolist() == [1.0, pytest.approx(0.9)]
    assert cfg.min_p is None
    assert cfg.all_greedy is False and cfg.any_filter is True  # host hints: no tensor read to decide
    Info.need_min_p_sampling = True
    assert sampling_from_sglang(Info(), 2, torch.device("cpu")).min_p.tolist() == [0.0, pytest.approx(0.1)]
    Info.need_min_p_sampling = Info.need_top_p_sampling = Info.need_top_k_sampling = False
    assert sampling_from_sglang(Info(), 2, torch.device("cpu")).any_filter is False


def test_launch_time_pair_check(tmp_path) -> None:
    import json

    from dflash_sglang.core.config import DFlashConfigError
    from dflash_sglang.core.random_drafter import drafter_config_for, random_drafter
    from dflash_sglang.glue.pair_check import check_local_pair

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(
        {"hidden_size": 64, "vocab_size": 100, "num_hidden_layers": 8, "num_attention_heads": 4,
         "intermediate_size": 128}))

    class T:
        hidden_size, vocab_size, num_hidden_layers, num_attention_heads = 64, 100, 8, 4
        intermediate_size, num_key_value_heads = 128, 2

    random_drafter(drafter_config_for(T(), block_size=8)).save_pretrained(tmp_path / "ok")
    check_local_pair(str(target), str(tmp_path / "ok"))
    check_local_pair(str(target), "org/hub-id")  # not local: left to the worker
    (tmp_path / "empty").mkdir()
    with pytest.raises(DFlashConfigError, match="no config.json"):
        check_local_pair(str(target), str(tmp_path / "empty"))
    T.hidden_size = 32
    T.num_attention_heads = 2
    random_drafter(drafter_config_for(T(), block_size=8)).save_pretrained(tmp_path / "narrow")
    with pytest.raises(DFlashConfigError, match="hidden_size: drafter has 32, target has 64"):
        check_local_pair(str(target), str(tmp_path / "narrow"))
    with pytest.raises(DFlashConfigError, match="required"):
        check_local_pair(str(target), None)


def test_stream_plan_is_inline_off_cuda() -> None:
    from dflash_sglang.core.streams import StreamPlan

    plan = StreamPlan.for_device("cpu")
    assert plan.kind == "inline" and plan.stream is None
    x = torch.zeros(3)
    with plan.draft():
        x += 1
    plan.join()
    assert x.tolist() == [1.0, 1.0, 1.0]


def test_grammar_seams_the_worker_relies_on() -> None:
    """Structured output under our worker: SGLang advances each matcher over the committed tokens
    (``advance_grammar_fsm``, handing DFLASH workers the barrier under overlap), and its grammar
    objects have the methods core.grammar calls."""
    from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    assert SpeculativeAlgorithm.DFLASH.supports_grammar_overlap()
    assert list(inspect.signature(SchedulerBatchResultProcessor.advance_grammar_fsm).parameters) == [
        "self", "result", "batch"]
    expected = {"allocate_vocab_mask": ["self", "vocab_size", "batch_size", "device"],
                "fill_vocab_mask": ["self", "vocab_mask", "idx"], "accept_token": ["self", "token"],
                "rollback": ["self", "k"], "is_terminated": ["self"]}
    for name, params in expected.items():
        assert list(inspect.signature(getattr(BaseGrammarObject, name)).parameters) == params, name


def test_missing_draft_folder_is_one_line(tmp_path, monkeypatch) -> None:
    from dflash_sglang.core.config import DFlashConfigError
    from dflash_sglang.glue.pair_check import check_local_pair

    monkeypatch.chdir(tmp_path)
    (tmp_path / "drafters").mkdir()
    (tmp_path / "a-file").write_text("x")
    for missing in ("drafters/nope", str(tmp_path / "nope"), "./nope", "a/b/c", "a-file", "nope"):
        with pytest.raises(DFlashConfigError, match="no such folder"):
            check_local_pair(str(tmp_path), missing)
    check_local_pair(str(tmp_path), "org/hub-id")  # may be a hub id: left to SGLang


def test_prompt_guard_seam_and_rules() -> None:
    import pkgutil

    from dflash_sglang.glue.input_guard import VALIDATE_ONE, prompt_error, validate_prompt_hook

    owner, attr = VALIDATE_ONE.rsplit(".", 1)
    fn = getattr(pkgutil.resolve_name(owner), attr)
    assert list(inspect.signature(fn).parameters) == ["self", "obj", "input_ids"]
    assert prompt_error([1, 2, 3], 10) is None and prompt_error(None, 10) is None
    assert "empty" in prompt_error([], 10)
    assert "outside the vocabulary" in prompt_error([1, 10], 10)
    assert "outside the vocabulary" in prompt_error([-1], 10)

    class Manager:
        class model_config:  # noqa: N801
            vocab_size = 10

    class Obj:
        input_embeds = None

    validate_prompt_hook(Manager(), Obj(), [1])
    with pytest.raises(ValueError, match="empty"):
        validate_prompt_hook(Manager(), Obj(), [])


def test_seams_for_logprobs_and_logit_adjustments() -> None:
    from sglang.srt.layers.logprob_processor import compute_spec_logprobs
    from sglang.srt.layers.sampler import apply_custom_logit_processor
    from sglang.srt.runtime_context import get_spec
    from sglang.srt.sampling import penaltylib
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    params = inspect.signature(compute_spec_logprobs).parameters
    assert list(params)[:3] == ["batch", "logits_output", "predict"] and "chain_stride" in params
    assert list(inspect.signature(apply_custom_logit_processor).parameters) == [
        "logits", "sampling_batch_info", "num_tokens_in_batch"]
    assert callable(get_spec)
    # The penalties core.penalties implements, and which of them SGLang applies as a scaling (last).
    kinds = {n: getattr(penaltylib, n).is_multiplicative for n in dir(penaltylib)
             if n.startswith("Batched") and n != "BatchedPenalizerOrchestrator"}
    assert kinds == {"BatchedFrequencyPenalizer": False, "BatchedPresencePenalizer": False,
                     "BatchedMinNewTokensPenalizer": False, "BatchedRepetitionPenalizer": True}
    assert "penalizer_orchestrator=None" in inspect.getsource(SamplingBatchInfo.copy_for_forward)
    fields = set(SamplingBatchInfo.__dataclass_fields__)
    assert {"penalizer_orchestrator", "logit_bias", "has_custom_logit_processor", "min_ps",
            "need_min_p_sampling"} <= fields
