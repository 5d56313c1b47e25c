#!/usr/bin/env bash
# The recipe of drafters/smollm2-135m-dflash-b16, end to end, on CPU (about 5 h on 2 cores):
#   1. a task-diverse prompt mix from GSM8K *train* questions (no evaluation prompts);
#   2. stage 1: self-distil the first 1,024 prompts, train a 2-layer block-16 drafter 1,150 steps;
#   3. stage 2: self-distil 512 more prompts (the data cache grows shard by shard), warm-start from
#      stage 1 and train 2,000 steps on all 1,536;
#   4. stage 3: the multi-source prompt corpus (installs its Debian sources), the committed distill
#      stores (1,024 fp32 answers of up to 512 tokens, 64 held out; a rerun answers only what is
#      missing), warm-start from stage 2 and train 2,500 steps with a preconditioned fc, an 8,192-token
#      training softmax and a 16,384-token draft vocabulary (about 2 h 40 min more).
# Usage: examples/train_smollm2_drafter.sh [OUT_DIR]   (default: drafters/smollm2-135m-dflash-b16)
set -euo pipefail
OUT="${1:-drafters/smollm2-135m-dflash-b16}"
WORK="${WORK:-/tmp/dflash-smollm2-drafter}"
DATA="${DATA:-../shared/data}"
export OMP_WAIT_POLICY=PASSIVE  # no spinning OpenMP threads on a small shared machine

mkdir -p "$WORK"
T=$(dflash-sglang models fetch)
dflash-sglang train-prompts --source "$DATA/gsm8k_train.jsonl" --out "$WORK/mix.jsonl" -n 7400
common=(--target "$T" --data "$WORK/mix.jsonl" --eval-prompts 8 --max-answer-tokens 128 --gen-batch-size 64
        --gen-dtype bfloat16 --batch-size 8 --blocks-per-seq 16 --save-every 50 --threads 2)
dflash-sglang train "${common[@]}" --num-prompts 1024 --block-size 16 --layers 2 --steps 1150 --lr 1e-3 \
    --warmup 40 --out "$WORK/stage1" --state-dir "$WORK/stage1-state"
dflash-sglang train "${common[@]}" --num-prompts 1536 --init-from "$WORK/stage1" --steps 2000 --lr 6e-4 \
    --warmup 20 --out "$WORK/stage2" --state-dir "$WORK/stage2-state"
dflash-sglang train-corpus --out "$WORK/corpus"
dflash-sglang distill --target "$T" --corpus "$WORK/corpus/train.jsonl.gz" --out data/distill/smollm2-135m \
    --limit 1024
dflash-sglang distill --target "$T" --corpus "$WORK/corpus/train.jsonl.gz" --split heldout --limit 64 \
    --out data/distill/smollm2-135m-heldout
dflash-sglang train --target "$T" --store data/distill/smollm2-135m --eval-store data/distill/smollm2-135m-heldout \
    --eval-prompts 0 --num-prompts 0 --init-from "$WORK/stage2" --steps 2500 --batch-size 4 --blocks-per-seq 32 \
    --train-vocab 8192 --draft-vocab 16384 --eval-every 250 --save-every 250 --threads 2 \
    --out "$OUT" --state-dir "$WORK/stage3-state"
