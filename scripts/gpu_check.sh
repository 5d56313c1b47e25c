#!/usr/bin/env bash
# GPU check of the DFlash GPU path on a bare CUDA machine (torch + triton; no sglang, no network).
#   scripts/gpu_check.sh --out gpu_check.json [--peak-bw-tbs 4.8] [--batches 1,8,32] [--dry-run]
# Needs only this checkout: the repo root goes first on PYTHONPATH (our top-level `kernels` package
# must win over any same-named site package). PYTHON=... picks the interpreter (default python3).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="${REPO}${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python3}" "${REPO}/scripts/gpu_check.py" "$@"
