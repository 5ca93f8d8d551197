"""The prepared check of rlhf_dyna's GPU path on one GPU: one command, one line per check, a JSON summary.

    python scripts/gpu_check.py [--json gpu_check.json] [--no-vllm]      # from the repository root

The launcher (this process) counts GPUs and runs the pre-spawn checks as `python -m rlhf_dyna` does, verifies that
they left CUDA uninitialised, and starts one rank through `launch.spawn_ranks` with a preload (a GPU node must start
it as a fresh interpreter, not a fork). The rank joins a one-rank NCCL world and checks, each on its own: FSDP2
training steps in fp32 and bf16 (TF32 on), sharded loading of a safetensors checkpoint onto the GPU (pinned,
non-blocking), a DCP save and load of CUDA DTensors with the GPU RNG state, an in-place relayout through the VPS
executor (storage adopted), the executor on CUDA buffers (local copies, release of sources, verification over
NCCL, refusal of a CPU buffer), and, where a CUDA build of vLLM is installed, vLLM's sleep / wake sequence around
an in-place weight sync with greedy tokens unchanged. Exit 0 when every check passed; on a machine without CUDA it
says so and exits 0 having checked nothing. Everything it writes lives in a temporary directory, removed at the end.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's rlhf_dyna, also when another one is installed

import torch  # noqa: E402 -- after the path above
import torch.distributed as dist  # noqa: E402

from rlhf_dyna.checks.gpu import check_gpu  # noqa: E402
from rlhf_dyna.config import Config  # noqa: E402
from rlhf_dyna.launch import check_capacity, init_distributed, shutdown_distributed, spawn_ranks  # noqa: E402
from rlhf_dyna.launch.host import visible_gpu_count  # noqa: E402
from rlhf_dyna.models.build import ModelSpec, build_policy, make_hf_config, save_hf_dir  # noqa: E402
from rlhf_dyna.models.catalog import catalog_from_config  # noqa: E402
from rlhf_dyna.models.meta_init import checkpoint_loader, meta_policy  # noqa: E402
from rlhf_dyna.orchestrator.resume import rank_rng_state  # noqa: E402
from rlhf_dyna.rollout.vllm_engine import VLLMRollout  # noqa: E402
from rlhf_dyna.train.checkpoint import load_engines, save_engines  # noqa: E402
from rlhf_dyna.train.engine import TrainEngine, full_state_dict, token_logprobs  # noqa: E402
from rlhf_dyna.train.mesh import build_mesh  # noqa: E402
from rlhf_dyna.transition.executor import execute, prepare  # noqa: E402
from rlhf_dyna.transition.movers import local_of  # noqa: E402
from rlhf_dyna.parallel_layout import ParallelLayout  # noqa: E402
from rlhf_dyna.transition.relayout import bind_train_state, relayout  # noqa: E402
from rlhf_dyna.transition.transport import NCCL, ensure_warm, world_transport  # noqa: E402
from rlhf_dyna.transition.views import TORCH_DTYPES  # noqa: E402
from rlhf_dyna.transition.vps_mover import make_vps_mover  # noqa: E402
from rlhf_dyna.transition.vps_sync import VpsSync  # noqa: E402
from rlhf_dyna.vps.layout import build_layout  # noqa: E402
from rlhf_dyna.vps.plan import build_plan  # noqa: E402
from rlhf_dyna.vps.rank_plan import for_rank  # noqa: E402
from rlhf_dyna.vps.schedule import build_schedule  # noqa: E402
from rlhf_dyna.vps.spec import ParallelSpec, Phase  # noqa: E402

RANK_MODULE = "scripts.gpu_check"
RESULTS = "results.jsonl"


def tiny_spec():
    # head_dim 64 (every GPU attention backend takes it); peaked logits so greedy tokens are no near-ties
    return ModelSpec(arch="llama", vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2)


def batch(seed: int, rows: int = 4, seq: int = 16):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 256, (rows, seq), generator=g)
    response = torch.zeros(rows, seq, dtype=torch.long)
    response[:, seq // 2:] = 1
    return {"input_ids": ids, "attention_mask": torch.ones(rows, seq, dtype=torch.long), "response_mask": response}


def nll(outputs, micro, norm):
    mask = micro["response_mask"].float()
    return -(token_logprobs(outputs.logits, micro["input_ids"]) * mask).sum() / norm.num_tokens, {}


class RankChecks:
    """The checks inside the one rank, in order; each records ok / failed / skipped with its seconds."""

    def __init__(self, out: Path) -> None:
        self.out, self.rows = out, []
        self.model_dir = out / "model"

    def run(self, name: str, check) -> None:
        start = time.perf_counter()
        try:
            detail, status = check(), "ok"
            if isinstance(detail, tuple):  # ("skipped", why)
                status, detail = detail
        except Exception as err:  # noqa: BLE001 -- one failed check must not hide the others
            status, detail = "failed", f"{type(err).__name__}: {err} | {traceback.format_exc(limit=3)[-600:]}"
        row = {"check": name, "status": status, "seconds": round(time.perf_counter() - start, 2), "detail": str(detail)}
        self.rows.append(row)
        with open(self.out / RESULTS, "a") as f:
            f.write(json.dumps(row) + "\n")

    def engine(self, precision: str = "fp32", zero: int = 3):
        return TrainEngine(build_policy(tiny_spec(), seed=0), build_mesh(ParallelLayout(1, 1)), lr=1e-2, precision=precision, zero=zero)

    def rank_start(self) -> str:
        self.info = init_distributed(device="cuda")
        assert self.info.device.type == "cuda" and "nccl" in self.info.backend, self.info
        x = torch.ones(1, device=self.info.device)
        dist.all_reduce(x)
        assert torch.get_float32_matmul_precision() == "high", "TF32 is not on for fp32 matmuls"
        return f"{self.info.device} ({torch.cuda.get_device_name()}), backend {self.info.backend}, TF32 on"

    def nccl_warm_up(self) -> str:
        assert world_transport() == NCCL
        group = dist.new_group([0])
        assert ensure_warm(group, NCCL) and not ensure_warm(group, NCCL)
        return "a new group's first call made once"

    def fsdp_step(self, precision: str) -> str:
        engine = self.engine(precision)
        losses = [engine.step(batch(seed=s % 2), nll)["loss"] for s in range(4)]
        assert all(math.isfinite(v) for v in losses) and losses[2] < losses[0], losses
        assert next(engine.model.parameters()).device.type == "cuda"
        return f"losses {[round(v, 3) for v in losses]}"

    def sharded_load(self) -> str:
        source = self.engine()
        saved = {n: t.detach().cpu().clone() for n, t in full_state_dict(source)}
        save_hf_dir(list(saved.items()), make_hf_config(tiny_spec()), self.model_dir)
        loaded = TrainEngine(meta_policy(make_hf_config(tiny_spec()), torch.float32), build_mesh(ParallelLayout(1, 1)),
                             materialize=checkpoint_loader(self.model_dir, self.info.device))
        for name, t in full_state_dict(loaded):
            assert t.device.type == "cuda" and torch.equal(t.cpu(), saved[name]), name
        return f"{len(saved)} tensors, {loaded.materialized.bytes_read:,} bytes read onto {self.info.device}"

    def dcp(self) -> str:
        engine = self.engine()
        engine.step(batch(0), nll)
        want = {n: t.detach().clone() for n, t in full_state_dict(engine)}
        save_engines({"actor": engine}, self.out / "dcp")
        with torch.no_grad():
            for p in engine.model.parameters():
                p.add_(1.0)
        load_engines({"actor": engine}, self.out / "dcp")
        assert all(torch.equal(t, want[n]) for n, t in full_state_dict(engine))
        assert "cuda" in rank_rng_state(), "the GPU's RNG state is not checkpointed"
        return "DTensor shards and AdamW state back after a perturbation; GPU RNG state saved"

    def relayout_in_place(self) -> str:
        engine = self.engine()
        engine.step(batch(0), nll)
        old = {k: local_of(t).untyped_storage().data_ptr() for k, t in bind_train_state(engine).items()}
        moved, stats = relayout(engine, ParallelLayout(1, 1, zero=1),
                                mover=make_vps_mover(engine.model.config, verify=True, in_place=True))
        adopted = sum(local_of(t).untyped_storage().data_ptr() == old[k] for k, t in bind_train_state(moved).items())
        assert adopted == len(old), (adopted, len(old))
        assert math.isfinite(moved.step(batch(1), nll)["loss"])
        return f"zero3 -> zero1: {adopted} shards adopted in place, {stats.rounds} rounds"

    def executor(self) -> str:
        config = make_hf_config(tiny_spec())
        src = build_layout(catalog_from_config(config, "float32", "float32"), ParallelSpec(dp=1))
        dst = build_layout(catalog_from_config(config, "bfloat16", "float32"), ParallelSpec(Phase.ROLLOUT, tp=1))
        plan = prepare(for_rank(build_schedule(build_plan(src, dst, ranks_per_node=8), 1 << 20), 0))
        device = self.info.device
        src_bufs = {n: torch.randn(b.shape, device=device).to(TORCH_DTYPES[b.dtype]) for n, b in src.buffers(0).items()}
        dst_bufs = {n: torch.zeros(b.shape, dtype=TORCH_DTYPES[b.dtype], device=device) for n, b in dst.buffers(0).items()}
        released: list[str] = []
        stats = execute(plan, src_bufs, dst_bufs, verify=True, release=released.append)  # verify raises if wrong
        assert stats.local_bytes > 0 and sorted(released) == sorted(plan.src_needs), (len(released), len(plan.src_needs))
        wrong = {**dst_bufs, next(iter(dst_bufs)): next(iter(dst_bufs.values())).cpu()}
        try:
            execute(plan, src_bufs, wrong)
        except ValueError as err:
            assert "transport moves cuda tensors" in str(err), err
        else:
            raise AssertionError("a CPU destination buffer was accepted on NCCL")
        return (f"{stats.local_bytes:,} bytes of local copies fp32 -> bf16 fused, verified; {len(released)} sources "
                f"released; a CPU buffer refused")

    def vllm_sleep_wake(self) -> str | tuple[str, str]:
        try:
            from vllm.platforms import current_platform
        except ImportError as err:
            return "skipped", f"vLLM is not importable ({err})"
        if not current_platform.is_cuda_alike():
            return "skipped", "the installed vLLM is not a CUDA build"
        if not (self.model_dir / "config.json").exists():
            return "skipped", "no model directory (sharded_load failed)"
        rollout = VLLMRollout(self.model_dir, max_model_len=256, kv_cache_bytes=0, dtype="bfloat16",
                              gpu_memory_utilization=0.3, enforce_eager=False, sleep_level=1)
        prompts = [[5, 9, 3, 200, 17], [60, 1, 2], list(range(1, 40))]

        def greedy():
            return [s[0].token_ids for s in rollout.generate(prompts, temperature=0.0, max_tokens=16)]

        before = greedy()
        free_awake = torch.cuda.mem_get_info()[0]
        rollout.sleep()
        freed = torch.cuda.mem_get_info()[0] - free_awake
        assert freed > 1 << 30, f"sleep freed only {freed / 2**30:.2f} GiB"
        rollout.wake_up(("weights",))
        sync, engine = VpsSync(verify=True), self.engine()  # the same weights as the model directory
        sync.sync(engine, rollout)
        assert not sync._plans_cached.destination.staged, sync._plans_cached.destination.kernel_problems[:3]
        rollout.wake_up()
        after = greedy()
        assert after == before, (before, after)
        rollout.shutdown()
        return f"sleep freed {freed / 2**30:.1f} GiB; in-place sync after wake-up; greedy tokens unchanged"


def rank_main(out: Path) -> None:
    checks = RankChecks(out)
    try:
        checks.run("rank_start", checks.rank_start)
        if checks.rows[-1]["status"] != "ok":
            return
        checks.run("nccl_warm_up", checks.nccl_warm_up)
        checks.run("fsdp_step_fp32", lambda: checks.fsdp_step("fp32"))
        checks.run("fsdp_step_bf16", lambda: checks.fsdp_step("bf16"))
        checks.run("sharded_load", checks.sharded_load)
        checks.run("dcp_save_load", checks.dcp)
        checks.run("relayout_in_place", checks.relayout_in_place)
        checks.run("executor_cuda", checks.executor)
        if os.environ.get("GPU_CHECK_VLLM", "1") == "1":
            checks.run("vllm_sleep_wake", checks.vllm_sleep_wake)
    finally:
        shutdown_distributed()


def launcher_checks() -> tuple[list[dict], int]:
    """The pre-spawn path of `python -m rlhf_dyna` on this machine: GPU count, the GPU checks of a one-rank CUDA run
    and the capacity check, none of which may initialise CUDA here."""
    start = time.perf_counter()
    gpus = visible_gpu_count()
    cfg = Config()
    cfg.parallel.device, cfg.parallel.world_size = "cuda", 1
    cfg.rollout.tp, cfg.task.prompts_per_step = 1, 1
    if gpus:
        check_gpu(cfg, under_torchrun=False)
        check_capacity(1, "cuda")
    clean = not torch.cuda.is_initialized()
    detail = f"{gpus} GPU(s) counted through NVML; CUDA {'un' if clean else ''}initialised in the launcher"
    return [{"check": "launcher_no_cuda_init", "status": "ok" if clean else "failed",
             "seconds": round(time.perf_counter() - start, 2), "detail": detail}], gpus


def summary(rows: list[dict], cuda: bool, seconds: float, note: str = "") -> dict:
    start = next((r["detail"] for r in rows if r["check"] == "rank_start" and r["status"] == "ok"), None)
    return {"cuda": cuda, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "device": start, "passed": sum(r["status"] == "ok" for r in rows),
            "failed": sum(r["status"] == "failed" for r in rows),
            "skipped": sum(r["status"] == "skipped" for r in rows), "seconds": round(seconds, 1), "note": note,
            "checks": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the JSON summary to this file")
    parser.add_argument("--no-vllm", action="store_true", help="leave out the vLLM sleep / wake check")
    parser.add_argument("--rank", type=Path, help=argparse.SUPPRESS)  # inside the spawned rank: its output dir
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank)
        return 0
    start = time.perf_counter()
    rows, gpus = launcher_checks()
    if gpus == 0:
        note = (f"no CUDA device visible (torch {torch.__version__}, CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): nothing of the GPU path was checked")
        print(f"gpu_check: skipped: {note}", flush=True)
        report = summary([], False, time.perf_counter() - start, note)
    else:
        out = Path(tempfile.mkdtemp(prefix="rlhf_dyna_gpu_check_"))
        try:
            env = {"GPU_CHECK_VLLM": "0" if args.no_vllm else "1", "VLLM_LOGGING_LEVEL": "ERROR",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
            code = spawn_ranks(1, RANK_MODULE, ["--rank", str(out)], out / "run", env=env, preload=("torch",))
            results = out / RESULTS
            rows += [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
            if code != 0:
                rows.append({"check": "rank_exit", "status": "failed", "seconds": 0.0,
                             "detail": f"the rank exited with code {code}; see its log above"})
        finally:
            shutil.rmtree(out, ignore_errors=True)
        for r in rows:
            print(f"gpu_check: {r['check']}: {r['status']} ({r['seconds']} s): {r['detail']}", flush=True)
        report = summary(rows, True, time.perf_counter() - start)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
