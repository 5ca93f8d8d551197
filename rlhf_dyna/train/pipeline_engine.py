"""Pipeline-parallel training engine: `torch.distributed.pipelining` stages, FSDP2 over dp inside each stage.

Same surface as `TrainEngine` (logprobs, values, step(batch, loss_fn), dp_sum, clip_gradients): every rank of one
pipeline (the ranks sharing a dp coordinate) passes the same batch; the first stage feeds input_ids, the last stage
runs the loss, and metrics / log-probs come back to every stage of the pipeline. Micro-batches are the engine's
`micro_batch_size` rows each; the batch must split into equal ones (the stages' shapes are given to torch up front,
so no metadata pass runs real forwards), and 1F1B needs at least `pp` of them.

Mesh: ("pp", "dp", "tp"), pp outermost (vps.spec: pp, dp, tp rank order); a stage's FSDP2 group is its dp slice.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import DTensor

from rlhf_dyna.models.build import ValueOutput
from rlhf_dyna.train.engine import LossFn, TrainEngine, position_ids_from_mask, reshard
from rlhf_dyna.train.grad_norm import clip_grads_, squared_grad_norm
from rlhf_dyna.train.logprobs import logits_to_keep, token_logprobs
from rlhf_dyna.train.pp_stage import StageModule, bubble_fraction, split_stage
from rlhf_dyna.vps.spec import train_spec

SCHEDULES = {"1F1B": Schedule1F1B, "GPipe": ScheduleGPipe}


def _local(t: Tensor) -> Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


class PipelineEngine(TrainEngine):
    """A TrainEngine over one pipeline stage of `model` (the whole HF model, real or on meta: it is split here)."""

    def __init__(self, model: nn.Module, mesh: DeviceMesh, schedule: str = "1F1B", **kwargs) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"pp schedule={schedule!r}; valid: {sorted(SCHEDULES)}")
        if kwargs.get("micro_batch_tokens"):
            raise ValueError(f"micro_batch_tokens={kwargs['micro_batch_tokens']} with pipeline parallel: a pipeline's "
                             f"micro-batches have one static shape; use micro_batch_size (micro_batch_tokens=0)")
        if kwargs.get("share_prompts"):
            raise ValueError("share_prompts with pipeline parallel: a pipeline's micro-batches have one static shape")
        self.schedule_name = schedule
        self.pp_mesh = mesh["pp"]
        self.spec = train_spec(mesh["dp"].size(), mesh["tp"].size(), pp=self.pp_mesh.size())
        stage = split_stage(model, self.spec, self.pp_mesh.get_local_rank())
        super().__init__(stage, mesh, **kwargs)
        self.stage_module: StageModule = stage
        self.tied = bool(stage.config.tie_word_embeddings) and self.pp_size > 1
        self.tied_group = self._tied_group(mesh) if self.tied else None
        self.last_bubble_fraction = 0.0

    @property
    def pp_size(self) -> int:
        return self.pp_mesh.size()

    @property
    def last_stage_rank(self) -> int:
        """Global rank of this pipeline's last stage (it computes losses, log-probs and values)."""
        return dist.get_global_rank(self.pp_mesh.get_group(), self.pp_size - 1)

    def _tied_group(self, mesh: DeviceMesh) -> dist.ProcessGroup | None:
        """{first stage, last stage} of this pipeline: the two holders of a tied embedding. Collective over the world."""
        if self.pp_size == 2:
            return self.pp_mesh.get_group()
        grid = mesh.mesh.reshape(self.pp_size, -1)
        mine = None
        for column in range(grid.shape[1]):
            pair = [int(grid[0, column]), int(grid[-1, column])]
            group = dist.new_group(pair)
            mine = group if dist.get_rank() in pair else mine
        return mine

    def optimizer_aliases(self) -> dict[str, str]:
        """Checkpoints keep the tied lm_head's AdamW state under the embedding's name (train.checkpoint): the first
        stage holds the same values, and the dp-only engine names the tied tensor so."""
        return {"lm_head.weight": "model.embed_tokens.weight"} if self.tied and self.stage_module.is_last else {}

    def pipeline_metrics(self) -> dict[str, float]:
        return {"pp/bubble_fraction": self.last_bubble_fraction, "pp/stages": float(self.pp_size)}

    # --- schedule construction -------------------------------------------------------------------------------------
    def _act_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.precision == "bf16" else next(self.model.parameters()).dtype

    def _schedule(self, n: int, rows: int, seq: int, loss_fn=None, read_logprobs: bool = False):
        """A PipelineStage with static shapes for [rows, seq] micro-batches, and its schedule (built per call: shapes
        follow the batch; building costs no communication beyond torch's one-int warm-up vote)."""
        stage = self.stage_module
        hidden = self.model.config.hidden_size
        meta = dict(device="meta")
        inputs = (torch.empty(rows, seq, dtype=torch.long, **meta) if stage.is_first
                  else torch.empty(rows, seq, hidden, dtype=self._act_dtype(), **meta))
        if loss_fn is not None and not stage.is_first:
            inputs.requires_grad_(True)  # received activations carry gradients back to the previous stage
        if not stage.is_last:
            output = torch.empty(rows, seq, hidden, dtype=self._act_dtype(), **meta)
        elif read_logprobs or stage.head_name == "value_head":
            output = torch.empty(rows, seq, dtype=torch.float32 if read_logprobs else self._act_dtype(), **meta)
        else:
            output = torch.empty(rows, stage.logits_to_keep or seq, self.model.config.vocab_size, dtype=self._act_dtype(),
                                 **meta)
        if loss_fn is not None and not stage.is_last:
            output.requires_grad_(True)  # so torch allocates the buffer for the gradient coming back
        pipe_stage = PipelineStage(self.model, self.pp_mesh.get_local_rank(), self.pp_size, self.device,
                                   input_args=inputs, output_args=output, group=self.pp_mesh.get_group())
        cls = SCHEDULES[self.schedule_name] if loss_fn is not None else ScheduleGPipe
        return cls(pipe_stage, n_microbatches=n, loss_fn=loss_fn, scale_grads=False)

    def _split(self, batch: dict[str, Tensor], rows_checked: bool = False) -> tuple[int, int]:
        """(micro-batches, rows each): equal micro-batches of micro_batch_size rows."""
        self._micro_batch_plan(batch, rows_checked)  # checks that every dp rank passes the same batch size
        rows = batch["input_ids"].shape[0]
        mbs = min(self.micro_batch_size or rows, rows)
        if rows % mbs:
            raise ValueError(f"pipeline parallel needs equal micro-batches: {rows} rows per dp rank do not split into "
                             f"micro_batch_size={mbs}; choose a micro_batch_size that divides {rows}")
        n = rows // mbs
        if self.schedule_name == "1F1B" and n < self.pp_size:
            raise ValueError(f"1F1B needs at least pp={self.pp_size} micro-batches, got {n} ({rows} rows / "
                             f"micro_batch_size={mbs}); lower micro_batch_size or use the GPipe schedule")
        return n, mbs

    def _run(self, schedule, batch: dict[str, Tensor], train: bool, target: Tensor | None = None,
             labels: Tensor | None = None) -> Tensor | None:
        ids, mask = batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)
        kwargs = dict(attention_mask=mask, position_ids=position_ids_from_mask(mask))
        if labels is not None:
            kwargs["labels"] = labels.to(self.device)
        args = (ids,) if self.stage_module.is_first else ()
        run = schedule.step if train else schedule.eval
        return run(*args, target=target, return_outputs=not train, **kwargs)

    def _broadcast_from_last(self, value: Tensor) -> Tensor:
        dist.broadcast(value, src=self.last_stage_rank, group=self.pp_mesh.get_group())
        return value

    # --- training ------------------------------------------------------------------------------------------------
    def step(self, batch: dict[str, Tensor], loss_fn: LossFn) -> dict[str, float]:
        if self.optimizer is None:
            raise RuntimeError("this engine was built with trainable=False (a reference model)")
        self.model.train()
        norm = self.loss_norm(batch)
        n, mbs = self._split(batch, rows_checked=True)
        micro = [{k: v[i * mbs:(i + 1) * mbs].to(self.device) for k, v in batch.items()} for i in range(n)]
        summed: dict[str, float] = {}

        def pipeline_loss(output: Tensor, index: Tensor) -> Tensor:
            out = SimpleNamespace(logits=output) if self.stage_module.head_name == "lm_head" else ValueOutput(values=output)
            loss, metrics = loss_fn(out, micro[int(index[0])], norm)
            for key, value in {"loss": float(loss.detach()), **metrics}.items():
                summed[key] = summed.get(key, 0.0) + float(value)
            return loss

        self.optimizer.zero_grad(set_to_none=True)
        self._keep_logits(batch.get(self.loss_mask_key))
        schedule = self._schedule(n, mbs, batch["input_ids"].shape[1], loss_fn=pipeline_loss)
        self.last_bubble_fraction = bubble_fraction(self.pp_size, n)  # what this step's schedule predicts
        self._run(schedule, batch, train=True, target=torch.arange(n) if self.stage_module.is_last else None)
        self._sum_tied_grads()
        grad_norm = self.clip_gradients()
        self.optimizer.step()
        if self.zero < 3:
            self.materialize_replicas()
        return {**self._share_metrics(summed), "grad_norm": grad_norm}

    def _share_metrics(self, summed: dict[str, float]) -> dict[str, float]:
        """The last stage's metrics, averaged over its dp group, on every stage of the pipeline."""
        keys = [sorted(summed)]
        dist.broadcast_object_list(keys, src=self.last_stage_rank, group=self.pp_mesh.get_group())
        values = torch.tensor([summed.get(k, 0.0) for k in keys[0]], dtype=torch.float64)
        if self.stage_module.is_last:
            values = self.dp_sum(values) / self.dp_size
        values = self._broadcast_from_last(values)
        return dict(zip(keys[0], values.tolist()))

    @torch.no_grad()
    def _sum_tied_grads(self) -> None:
        """The tied embedding's two copies get the sum of both stages' gradients (same FSDP shard on both)."""
        if not self.tied:
            return
        stage = self.stage_module
        param = stage.model.embed_tokens.weight if stage.is_first else stage.lm_head.weight
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        dist.all_reduce(_local(param.grad), group=self.tied_group)

    def clip_gradients(self) -> float:
        """Global L2 norm over every stage (the tied embedding counted once), clipped per stage (train/grad_norm.py)."""
        params = [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        skip = {id(self.stage_module.lm_head.weight)} if self.tied and self.stage_module.is_last else set()
        squares = squared_grad_norm([p.grad for p in params if id(p) not in skip])
        dist.all_reduce(squares, group=self.pp_mesh.get_group())
        total = squares.sqrt()
        if self.grad_clip is not None:
            clip_grads_([p.grad for p in params], self.grad_clip, total)
        return float(total)

    def _keep_logits(self, loss_mask: Tensor | None) -> None:
        """The LM head of the last stage runs from the batch's first loss-mask column on (static across micro-batches:
        the schedule's shapes are fixed up front); everywhere without a mask."""
        self.stage_module.logits_to_keep = logits_to_keep(loss_mask) if loss_mask is not None else 0

    # --- forward only ------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _pipeline_inference(self, input_ids: Tensor, attention_mask: Tensor, reader,
                            loss_mask: Tensor | None = None) -> Tensor:
        self.model.eval()
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        n, mbs = self._split_forward(batch)
        self._keep_logits(loss_mask)
        self.stage_module.reader = reader
        try:
            schedule = self._schedule(n, mbs, input_ids.shape[1], read_logprobs=True)
            out = self._run(schedule, batch, train=False, labels=input_ids)
        finally:
            self.stage_module.reader = None
        result = out.float() if self.stage_module.is_last else torch.empty(input_ids.shape, dtype=torch.float32)
        if self.zero == 3:
            reshard(self.model)
        return self._broadcast_from_last(result.to(self.device).contiguous()).cpu()

    def _split_forward(self, batch: dict[str, Tensor]) -> tuple[int, int]:
        self._micro_batch_plan(batch)
        rows = batch["input_ids"].shape[0]
        mbs = min(self.micro_batch_size or rows, rows)
        while rows % mbs:  # forward-only: any equal split works; the largest that fits micro_batch_size
            mbs -= 1
        return rows // mbs, mbs

    def logprobs(self, input_ids: Tensor, attention_mask: Tensor, temperature: float = 1.0,
                 response_mask: Tensor | None = None) -> Tensor:
        return self._pipeline_inference(input_ids, attention_mask,
                                        lambda logits, ids: token_logprobs(logits, ids, temperature), response_mask)

    def values(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self._pipeline_inference(input_ids, attention_mask, lambda values, ids: values.float())

    @torch.no_grad()
    def full_state(self, dtype: torch.dtype | None = None) -> list[tuple[str, Tensor]]:
        """(HF name, full tensor) for every parameter of the whole model, on every rank: each stage gathers its own
        over dp, then the stages exchange them (tiny models and exports; the per-step sync moves shards by VPS).
        A tied embedding appears once per name (model.embed_tokens.weight from the first stage, lm_head.weight from
        the last)."""
        reshard(self.model)
        mine = []
        for name, param in self.model.named_parameters():
            full = param.full_tensor() if isinstance(param, DTensor) else param.detach()
            mine.append((name, (full if dtype is None else full.to(dtype)).cpu()))
        stages: list[list[tuple[str, Tensor]] | None] = [None] * self.pp_size
        dist.all_gather_object(stages, mine, group=self.pp_mesh.get_group())
        seen, out = set(), []
        for stage in stages:
            for name, full in stage:
                if name not in seen:
                    seen.add(name)
                    out.append((name, full.to(self.device)))
        return out


def make_engine(model: nn.Module, mesh: DeviceMesh, pp_schedule: str = "1F1B", **kwargs) -> TrainEngine:
    """A PipelineEngine on a ("pp", "dp", "tp") mesh (train.mesh.build_mesh), a TrainEngine on a (dp, tp) one."""
    if "pp" in (mesh.mesh_dim_names or ()):
        return PipelineEngine(model, mesh, schedule=pp_schedule, **kwargs)
    return TrainEngine(model, mesh, **kwargs)
