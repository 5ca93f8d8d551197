"""Training engine: one (FSDP2 [+ TP]) model per rank with AdamW, grad clipping and micro-batched steps.

Loss scaling across micro-batches (and dp ranks). `step` hands every `loss_fn` call a `LossNorm` whose
counts are the *dp-group* totals divided by the dp size. A loss_fn that returns
`sum(per_token_loss * mask) / norm.num_tokens` then yields, after the micro-batch gradients are summed
by `backward()` and averaged over dp by FSDP's reduce-scatter, exactly the gradient of the global token
mean over the whole dp group's batch, whatever the micro-batch split (same for `num_sequences`).
Metrics a loss_fn returns follow the same rule: summed over micro-batches, averaged over dp.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from rlhf_dyna.train.grad_norm import clip_grads_, squared_grad_norm
from rlhf_dyna.train.logprobs import logits_to_keep, token_logprobs
from rlhf_dyna.train.optimizer import adamw
from rlhf_dyna.train.micro_batches import MicroBatch, fixed_rows, pack_by_tokens, row_lengths, split_to, take, token_budget_plan
from rlhf_dyna.train.parallelize import parallelize
from rlhf_dyna.train.shared_prompts import PackedPrompts, pack_shared_prompts, unpacked_logits


@dataclass(frozen=True)
class LossNorm:
    num_tokens: float  # sum of batch[loss_mask_key] over the dp group / dp size
    num_sequences: float  # sequences in the dp group's batch / dp size
    num_nonempty_sequences: float = 0.0  # those with at least one loss-mask token / dp size (seq-mean losses)


LossFn = Callable[[object, dict[str, Tensor], LossNorm], tuple[Tensor, dict[str, float]]]


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding, so a padded row sees the positions vLLM gives the unpadded prompt."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class TrainEngine:
    """Owns a parallelized model (policy, value model or frozen reference) and its optimizer on this rank.

    Ranks of one TP group must pass identical batches; each dp rank passes its own shard, and every dp
    rank must pass the same batch size (FSDP's gathers are collective per micro-batch)."""

    def __init__(
        self,
        model: nn.Module,
        mesh: DeviceMesh,
        lr: float = 1e-6,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        grad_clip: float | None = 1.0,
        precision: str = "fp32",
        micro_batch_size: int | None = None,
        micro_batch_tokens: int = 0,
        trainable: bool = True,
        loss_mask_key: str = "response_mask",
        zero: int = 3,
        materialize: Callable[[nn.Module], object] | None = None,
        share_prompts: bool = False,
    ) -> None:
        self.mesh = mesh
        self.zero = zero  # ZeRO stage on FSDP2; see parallelize.apply_fsdp for what 1/2/3 mean here
        self.precision = precision
        self.micro_batch_size = micro_batch_size
        self.micro_batch_tokens = micro_batch_tokens  # > 0: rows packed by length under this budget (train.micro_batches)
        self.grad_clip = grad_clip
        self.loss_mask_key = loss_mask_key
        self.share_prompts = share_prompts  # rows of one prompt on one forward of it (train.shared_prompts)
        self.device = torch.device("cuda", torch.cuda.current_device()) if mesh.device_type == "cuda" else torch.device("cpu")
        if not trainable:
            model.requires_grad_(False)
        self.model = parallelize(model, mesh, precision, zero)
        # a model built on the meta device gets its shards here, after the placements exist, before the optimizer
        self.materialized = materialize(self.model) if materialize is not None else None
        self.optimizer = adamw(self.model, lr=lr, betas=betas, weight_decay=weight_decay) if trainable else None

    def materialize_now(self, materialize: Callable[[nn.Module], object]) -> None:
        """An engine built on meta parameters without `materialize` (a skeleton, built ahead of time) gets its shards
        here; the optimizer is made again over the materialized parameters, with the constructor's settings."""
        self.materialized = materialize(self.model)
        if self.optimizer is not None:
            group = self.optimizer.param_groups[0]
            self.optimizer = adamw(self.model, lr=group["lr"], betas=group["betas"], weight_decay=group["weight_decay"])

    @property
    def dp_rank(self) -> int:
        return self.mesh["dp"].get_local_rank()

    @property
    def dp_size(self) -> int:
        return self.mesh["dp"].size()

    def dp_sum(self, values: Tensor) -> Tensor:
        """`values` summed over this engine's dp group (TP peers hold the same rows), on `values`' device."""
        total = values.to(self.device, copy=True)
        dist.all_reduce(total, group=self.mesh["dp"].get_group())
        return total.to(values.device)

    def _dp_sum(self, values: list[float]) -> list[float]:
        return self.dp_sum(torch.tensor(values, dtype=torch.float64)).tolist()

    def _check_equal_rows(self, size: int, rows: float, squares: float) -> None:
        """`rows` and `squares`: this rank's `size` and its square summed over dp; equal sizes on all dp ranks <=>
        mean(size^2) == mean(size)^2."""
        if squares * self.dp_size != rows ** 2:
            raise ValueError(f"dp ranks pass different batch sizes (this rank: {size}); every dp rank needs the same")

    def _micro_batch_plan(self, batch: dict[str, Tensor], rows_checked: bool = False) -> list[MicroBatch]:
        """micro_batch_size rows each, or packed by length under micro_batch_tokens, in as many micro-batches as the
        other dp ranks (collective over dp). `rows_checked`: loss_norm has checked the dp ranks' row counts."""
        size, width = batch["input_ids"].shape
        if not rows_checked:
            self._check_equal_rows(size, *self._dp_sum([size, size * size]))
        if not self.micro_batch_tokens:
            return fixed_rows(size, width, self.micro_batch_size or size)
        lengths = row_lengths(batch["attention_mask"])
        groups = pack_by_tokens(lengths, self.micro_batch_tokens)
        count = torch.tensor([len(groups)], device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=self.mesh["dp"].get_group())
        return token_budget_plan(split_to(groups, int(count), lengths), lengths)

    def _micro_batches(self, batch: dict[str, Tensor], rows_checked: bool = False) -> list[dict[str, Tensor]]:
        return [take(batch, micro, self.device) for micro in self._micro_batch_plan(batch, rows_checked)]

    def forward(self, micro_batch: dict[str, Tensor]) -> object:
        """HF forward with mask-derived positions; returns the model's output (`.logits` or `.values`). A causal LM
        given the loss mask keeps the logits of the last positions only, from the column before the mask's first
        token on (`train.logprobs.logits_to_keep`): the LM head runs where a loss reads log-probs."""
        mask = micro_batch["attention_mask"]
        extra = {"output_router_logits": True} if self.returns_aux_loss else {}  # HF then returns the router's aux_loss
        if self.loss_mask_key in micro_batch and hasattr(self.model, "lm_head"):
            keep = logits_to_keep(micro_batch[self.loss_mask_key])
            if self.share_prompts and not self.returns_aux_loss:
                packing = pack_shared_prompts(micro_batch["input_ids"], mask, micro_batch[self.loss_mask_key])
                if packing is not None:
                    return self._forward_packed(packing, keep)
            extra["logits_to_keep"] = keep
        return self.model(
            input_ids=micro_batch["input_ids"], attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False,
            **extra,
        )

    def _forward_packed(self, packing: PackedPrompts, keep: int) -> SimpleNamespace:
        """The causal LM over the packed rows; `.logits` [B, keep, V] in the rows' layout (train.shared_prompts)."""
        length = packing.input_ids.shape[1]
        out = self.model(input_ids=packing.input_ids.to(self.device), position_ids=packing.position_ids.to(self.device),
                         attention_mask=packing.attention_mask.to(self.device), use_cache=False,
                         logits_to_keep=length - packing.first_kept)
        return SimpleNamespace(logits=unpacked_logits(out.logits, packing, keep))

    @property
    def returns_aux_loss(self) -> bool:
        """MoE causal LMs (HF computes the load-balancing loss in the LM head's forward, not in a value model's)."""
        return bool(getattr(self.model.config, "num_experts", 0)) and hasattr(self.model, "lm_head")

    def step(self, batch: dict[str, Tensor], loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step over this rank's batch, accumulating gradients over micro-batches."""
        if self.optimizer is None:
            raise RuntimeError("this engine was built with trainable=False (a reference model)")
        self.model.train()
        norm = self.loss_norm(batch)
        self.optimizer.zero_grad(set_to_none=True)
        summed: dict[str, float] = {}
        micro_batches = self._micro_batches(batch, rows_checked=True)
        for micro_batch in micro_batches:
            output = self.forward(micro_batch)
            loss, metrics = loss_fn(output, micro_batch, norm)
            loss.backward()  # FSDP2 reduce-scatters each micro-batch's grads and accumulates the fp32 shards
            if getattr(output, "aux_loss", None) is not None:  # logged, not trained on: mean over micro-batches
                metrics = {**metrics, "aux_loss": float(output.aux_loss.detach()) / len(micro_batches)}
            for key, value in {"loss": float(loss.detach()), **metrics}.items():
                summed[key] = summed.get(key, 0.0) + float(value)
        grad_norm = self.clip_gradients()
        self.optimizer.step()
        if self.zero < 3:
            self.materialize_replicas()
        keys = sorted(summed)
        averaged = dict(zip(keys, (v / self.dp_size for v in self._dp_sum([summed[k] for k in keys]))))
        return {**averaged, "grad_norm": grad_norm}

    def loss_norm(self, batch: dict[str, Tensor]) -> LossNorm:
        """The dp group's counts of this step's batch, per dp rank, having checked that every dp rank passes as many
        rows (one collective over dp)."""
        mask = batch.get(self.loss_mask_key)
        tokens = float(mask.sum()) if mask is not None else 0.0
        nonempty = float((mask.sum(-1) > 0).sum()) if mask is not None else 0.0
        size = batch["input_ids"].shape[0]
        total_tokens, total_seqs, total_nonempty, squares = self._dp_sum([tokens, float(size), nonempty,
                                                                          float(size * size)])
        self._check_equal_rows(size, total_seqs, squares)
        return LossNorm(num_tokens=max(total_tokens, 1.0) / self.dp_size, num_sequences=total_seqs / self.dp_size,
                        num_nonempty_sequences=max(total_nonempty, 1.0) / self.dp_size)

    def materialize_replicas(self) -> None:
        """ZeRO-1/2: re-gather the replicated params from the (just updated) master shards."""
        reshard(self.model)
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.unshard()

    def clip_gradients(self) -> float:
        """Global L2 grad norm; clips to grad_clip when set (train/grad_norm.py: on the shards' local tensors)."""
        # the optimizer holds the sharded params that carry the grads; with ZeRO-1/2 the module shows the replicas
        grads = [p.grad for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        total = squared_grad_norm(grads).sqrt()
        if self.grad_clip is not None:
            clip_grads_(grads, self.grad_clip, total)
        return float(total)

    @torch.no_grad()
    def _inference(self, input_ids: Tensor, attention_mask: Tensor, read: Callable[[object, Tensor], Tensor],
                   loss_mask: Tensor | None = None, per_row: bool = False) -> Tensor:
        self.model.eval()
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        if loss_mask is not None:
            batch[self.loss_mask_key] = loss_mask
        out = torch.zeros(input_ids.shape[:1] if per_row else input_ids.shape, dtype=torch.float32)
        for micro in self._micro_batch_plan(batch):
            mb = take(batch, micro, self.device)
            result = read(self.forward(mb), mb["input_ids"]).float().cpu()
            if per_row:
                out[micro.rows] = result
            else:  # columns past a micro-batch's width are padding
                out[micro.rows, :micro.width] = result
        if self.zero == 3:
            reshard(self.model)  # the root stays unsharded after a no-grad forward; free it
        return out

    def logprobs(self, input_ids: Tensor, attention_mask: Tensor, temperature: float = 1.0,
                 response_mask: Tensor | None = None) -> Tensor:
        """[B, T] log-probs of each token given its prefix (column 0 is 0); mask with the response mask. Given the
        mask, columns before its first token are 0 (the LM head skips them)."""
        return self._inference(input_ids, attention_mask, lambda out, ids: token_logprobs(out.logits, ids, temperature),
                               response_mask)

    def values(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """[B, T] value-head outputs of a value model (value at t reads the prefix up to and including t)."""
        return self._inference(input_ids, attention_mask, lambda out, ids: out.values)

    def scores(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """[B] a one-label sequence classifier's score of each row (transformers' pooled value: at the last token
        that is not the config's pad_token_id)."""
        return self._inference(input_ids, attention_mask, lambda out, ids: out.logits[:, 0], per_row=True)


def reshard(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


@torch.no_grad()
def refresh_fsdp_shards(model: nn.Module) -> None:
    """FSDP2 all-gathers from its own flat view of each sharded param: re-read it after a param's local shard was
    replaced (an in-place relayout adopts the old engine's storage); a no-op for shards left as they were."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group  # torch's own _apply / load_state_dict do the same
            for fsdp_param in group.fsdp_params if group is not None else ():
                fsdp_param.reset_sharded_param()


def full_state_dict(engine: TrainEngine, dtype: torch.dtype | None = None) -> Iterator[tuple[str, Tensor]]:
    """(HF name, full tensor) for every parameter, gathered from FSDP/TP shards; collective: call on every rank.

    A tied parameter is gathered once and yielded under each of its names right away (vLLM's in-place
    reload needs `lm_head.weight` even when tied: a layer that receives no weight gets its old one back)."""
    if hasattr(engine, "full_state"):  # a pipeline stage holds part of the model (train.pipeline_engine)
        yield from engine.full_state(dtype)
        return
    reshard(engine.model)
    aliases: dict[int, list[str]] = {}
    for name, param in engine.model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    for _, param in engine.model.named_parameters():
        full = param.full_tensor() if isinstance(param, DTensor) else param.detach()
        full = full if dtype is None else full.to(dtype)
        for name in aliases[id(param)]:
            yield name, full
