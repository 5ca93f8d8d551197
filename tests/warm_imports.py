"""What the tests' forkserver imports (tests/forkserver.py): what the app's launcher preloads before forking ranks,
under the environment it preloads them in, plus the modules rank tests use."""
from __future__ import annotations

from rlhf_dyna.job import QUIET_ENV, RANK_PRELOAD
from rlhf_dyna.launch.fork import preload

preload(("rlhf_dyna.__main__", *RANK_PRELOAD, "rlhf_dyna.models.build", "rlhf_dyna.train.engine",
         "rlhf_dyna.transition.executor"), {**QUIET_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
