"""Checks of MoE runs: what runs live (FSDP2 over dp, expert parallel training over dp ranks, vLLM rollout
as one TP group, with or without vLLM's expert parallelism) and what not (expert TP, MoE with tp or pp)."""
from __future__ import annotations

from ..config import Config
from ..models.architectures import ARCHITECTURES
from ..parallel_layout import LayoutError

CPU_MOE_ALIGNMENT = 32  # vLLM 0.32's CPU MoE kernel pads each rank's expert intermediate dim to a multiple of this


class MoeConfigError(ValueError):
    pass


def is_moe(cfg: Config) -> bool:
    return ARCHITECTURES[cfg.model.arch].experts is not None or cfg.model.num_experts > 0


def moe_live_problems(cfg: Config, on_cpu: bool) -> list[str]:
    """Every reason this MoE config cannot run live, each saying what would be valid; [] = it runs."""
    m, t, r, world = cfg.model, cfg.parallel.train, cfg.rollout, cfg.parallel.world_size
    if not is_moe(cfg):
        return [f"rollout.expert_parallel=true with model.arch={m.arch} and no experts: vLLM's expert parallelism "
                f"spreads the experts of an MoE model; set rollout.expert_parallel=false"] if r.expert_parallel else []
    out = []
    if t.ep > 1:
        try:
            out += cfg.parallel.train_layout().expert_problems(m.num_experts)
        except LayoutError as err:  # ep against the ranks
            out.append(str(err).rstrip("."))
        if cfg.placement.policy != "colocate":
            out.append(f"parallel.train.ep={t.ep} with placement={cfg.placement.policy}: expert-parallel engines run "
                       f"live in colocated runs only (role moves between rank sets do not build EP meshes); use "
                       f"placement=colocate or parallel.train.ep=1")
    if t.pp > 1:
        out.append(f"parallel.train.pp={t.pp} with model.arch={m.arch}: pipeline stages of MoE layers are untested "
                   f"live; use parallel.train.pp=1 for MoE models")
    if t.tp > 1:
        out.append(f"parallel.train.tp={t.tp} with model.arch={m.arch}: the TP plan has no styles for the fused expert "
                   f"tensors; use parallel.train.tp=1 (FSDP2 over dp) for MoE models")
    if r.expert_parallel and m.num_experts < world:
        out.append(f"rollout.expert_parallel=true with model.num_experts={m.num_experts} on {world} rollout ranks: "
                   f"vLLM would leave ranks without experts; use at most {m.num_experts} ranks or "
                   f"rollout.expert_parallel=false")
    if r.expert_parallel and cfg.placement.policy != "colocate":
        out.append(f"rollout.expert_parallel=true with placement={cfg.placement.policy}: only the colocated rollout "
                   f"(one vLLM over every rank) runs vLLM's expert parallelism; use placement=colocate")
    if on_cpu and r.tp != world:
        out.append(f"rollout.tp={r.tp} on {world} CPU ranks gives vLLM data_parallel_size={world // max(r.tp, 1)}; vLLM "
                   f"0.32's CPU MoE layers then all-gather tokens across DP replicas (all_gatherv), which its CPU "
                   f"communicator does not implement; set rollout.tp={world} (one TP group over all ranks)")
    split = 1 if r.expert_parallel else max(r.tp, 1)  # expert parallel: whole experts, no TP slice of them
    if on_cpu and m.moe_intermediate_size and (m.moe_intermediate_size // split) % CPU_MOE_ALIGNMENT:
        what, value = (("model.moe_intermediate_size", f"{m.moe_intermediate_size}") if r.expert_parallel else
                       ("model.moe_intermediate_size / rollout.tp", f"{m.moe_intermediate_size} / {r.tp}"))
        out.append(f"{what} = {value} is not a multiple of {CPU_MOE_ALIGNMENT}: vLLM's CPU MoE kernel pads it and "
                   f"weight updates no longer fit its tensors; use model.moe_intermediate_size="
                   f"{CPU_MOE_ALIGNMENT * split} (or a multiple)")
    return out


def check_moe_live(cfg: Config, on_cpu: bool) -> None:
    problems = moe_live_problems(cfg, on_cpu)
    if problems:
        raise MoeConfigError("This MoE configuration does not run live yet: " + "; ".join(problems) + ".")
