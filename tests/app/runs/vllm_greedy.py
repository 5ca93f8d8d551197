"""`python -m tests.app.runs.vllm_greedy MODEL_DIR PROMPTS_JSON MAX_TOKENS`: vLLM's greedy tokens for the given prompt ids
as one json line (its own process: vLLM's engine and globals stay out of the test process)."""
from __future__ import annotations

import json
import os
import socket
import sys

from rlhf_dyna.rollout.vllm_engine import VLLMRollout


def main() -> None:
    with socket.socket() as sock:  # vLLM's CPU worker joins a (here one-rank) torch.distributed world
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    model_dir, prompts, max_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    rollout = VLLMRollout(model_dir, dtype="float32", max_model_len=64)
    try:
        outs = rollout.generate(prompts, n=1, temperature=0.0, max_tokens=max_tokens, stop_token_ids=[])
        print("GREEDY " + json.dumps([o[0].token_ids for o in outs]))
    finally:
        rollout.shutdown()


if __name__ == "__main__":
    main()
