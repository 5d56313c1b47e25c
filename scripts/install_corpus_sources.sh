#!/usr/bin/env bash
# Installs the Debian packages the training prompt corpus is built from (dflash_sglang/train/corpus.py).
# Debian 12 (bookworm), run as root. The Python stdlib source tree comes with the interpreter and
# GSM8K TRAIN comes from ../shared/data/gsm8k_train.jsonl; neither needs installing.
set -euo pipefail
PKGS=(manpages-de manpages-fr manpages-es python3-doc wordnet-base debian-reference-en)
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PKGS[@]}"
dpkg-query -W -f='${Package} ${Version}\n' "${PKGS[@]}"
