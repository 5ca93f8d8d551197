"""`dry_run=true`: plan every transition the recipe performs, without devices; table + plan_summary.json."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..config import Config
from ..models.catalog import catalog_from_config
from ..models.hf_config import hf_config_from_fields, make_hf_config, model_source
from ..parallel_layout import RolloutLayout
from ..tasks.tokenizer import CharTokenizer
from ..vps.cost import Cluster
from ..vps.dryrun import Transition, summarize, write_summary
from .membership import membership_rows
from .placements import placement_transitions
from .reward_dry_run import host_copy_rows


def recipe_transitions(cfg: Config) -> list[Transition]:
    """Each step moves the trained weights into vLLM's layout (across rank sets under split), then every
    role-state move the placement implies (reshard/<role>/<from_phase>_to_<to_phase>). The specs come from the
    parallel layouts the live run builds its meshes from."""
    if cfg.placement.policy == "colocate":
        layout = cfg.parallel.train_layout(master_weights=cfg.model.dtype != "float32")
        rollout = RolloutLayout(cfg.parallel.world_size, cfg.rollout.tp, expert_parallel=cfg.rollout.expert_parallel)
        return [Transition("train_to_rollout", layout.spec(), rollout.spec())]
    return placement_transitions(cfg)


def cluster_of(cfg: Config) -> Cluster:
    c = cfg.cluster
    return Cluster(c.nodes, c.devices_per_node, c.intra_node_gb_per_s, c.inter_node_gb_per_s,
                   c.intra_latency_us * 1e-6, c.inter_latency_us * 1e-6)


def model_catalog(cfg: Config):
    """Catalog of the model the run would build: the tiny spec itself when random-init, else the config fields."""
    m = cfg.model
    source = model_source(m, CharTokenizer())
    if not isinstance(source, str):
        return catalog_from_config(make_hf_config(source), param_dtype=m.dtype)
    hf = hf_config_from_fields(
        m.arch, m.vocab_size, m.hidden_size, m.intermediate_size, m.num_hidden_layers, m.num_attention_heads,
        m.num_key_value_heads, m.head_dim, m.tie_word_embeddings, m.num_experts, m.num_experts_per_tok,
        m.moe_intermediate_size,
    )
    return catalog_from_config(hf, param_dtype=m.dtype)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def print_table(recipe: str, rows: list[dict]) -> None:
    table = Table(title=f"dry run: {recipe} (predicted on the `cluster` description)")
    for col in ("transition", "src -> dst", "total", "moved", "minimum", "rounds", "peak extra / rank",
                "predicted s", "planning s"):
        table.add_column(col, justify="left" if col in ("transition", "src -> dst") else "right")
    for r in rows:
        table.add_row(r["transition"], escape(f"{r['src']} -> {r['dst']}"), human_bytes(r["bytes_total"]),
                      human_bytes(r["bytes_moved"]), human_bytes(r["bytes_min"]), str(r["rounds"]),
                      human_bytes(r["peak_extra_bytes"]), f"{r['predicted_s']:.4f}", f"{r['planning_s']:.3f}")
    Console(width=200).print(table)


def run_dry_run(cfg: Config, out_dir: Path) -> list[dict]:
    catalog, cluster = model_catalog(cfg), cluster_of(cfg)
    rows = summarize(catalog, recipe_transitions(cfg), cluster) + membership_rows(cfg, catalog, cluster) + \
        host_copy_rows(cfg, catalog)
    print_table(cfg.recipe, rows)
    path = write_summary(rows, out_dir / "plan_summary.json")
    print(f"rlhf_dyna: dry run of {cfg.recipe}: {len(rows)} transition(s) planned, summary in {path}")
    return rows
