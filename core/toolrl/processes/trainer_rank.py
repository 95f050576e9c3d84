"""One trainer rank: its shard of the model, its optimizer, the GRPO step, its part of checkpoints and
of weight syncs.

Rank ``r`` of ``world_size``: with one rank it holds the whole model (in the driver without Ray, or
as one Ray actor); with more it joins a ``torch.distributed`` process group (gloo on CPU, NCCL on
GPU) and shards the model with FSDP2 (:mod:`toolrl.training.sharding`). The same class is the Ray actor
(:mod:`toolrl.processes.trainer_group` wraps it with ``ray.remote``) and the in-process trainer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from toolrl import model_sources
from toolrl.agent_roles import frozen_roles
from toolrl.algorithms import VALUES
from toolrl.config import Config, ConfigError, one_line
from toolrl.model_sources import model_path
from toolrl.processes import rank_state
from toolrl.processes.in_process import seed_everything
from toolrl.processes.ray_actors import actor_info, rendezvous_address
from toolrl.processes.resolve import RunPlan, run_plan
from toolrl.training import lora
from toolrl.training.policy import build_policy
from toolrl.training.weight_sync import Delta, push_local, send_owned
from toolrl.trajectory import Trajectory
from toolrl.transports import TransportError


class TrainerRank:
    def __init__(self, config: Config | Mapping[str, Any], rank: int = 0, world_size: int = 1,
                 plan: RunPlan | None = None) -> None:
        """``plan``: what the run check decided (:func:`toolrl.processes.resolve.resolve_run`); decided at
        :meth:`setup` for a rank built on its own."""
        self.config = config if isinstance(config, Config) else Config.model_validate(dict(config))
        self.rank, self.world_size = rank, world_size
        self.plan = plan
        self.model: Any = None  # the causal LM (its parameters are DTensors when sharded)
        self.policy: Any = None  # what runs the loss: the model, or the FSDP root around it
        self.optimizer: Any = None
        self.ref_model: Any = None
        self.critic: Any = None  # toolrl.training.critic.Critic, when config.critic is set
        # The algorithm's parts, built once for the run (the controller checked them already).
        from toolrl.algorithms import build_estimator, build_loss

        self.estimator, self.loss = build_estimator(self.config.algorithm), build_loss(self.config.algorithm)
        self.pad_id = 0
        self.processor: Any = None  # a vision-language model's (its images' pixel values)
        self.sp: Any = None  # this rank's sequence-parallel group (toolrl.training.sequence_parallel)
        self.device = "cpu"
        self.held: dict[int, list[Any]] = {}  # step -> other ranks' copies kept on this node (hold_copies)
        self.link: Any = None  # this rank's sending end of a weight transport's link
        self.sync_plan: Any = None  # what a weight sync sends (toolrl.training.weight_sync.SyncPlan)
        # Delta sync: what the current receivers hold, and who they are (a link's key; in process, the engines).
        self.delta: Any = None
        self.delta_receivers: tuple[str, ...] = ()

    # ----------------------------------------------------------------- set-up

    def address(self) -> tuple[str, int]:
        """This node's address and a free port: where rank 0 hosts the process group's rendezvous."""
        return rendezvous_address()

    def setup(self, master: tuple[str, int] | None = None, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
        """Build this rank's model shard and optimizer. ``master``: rank 0's (host, port) when
        ``world_size > 1``; ``model``/``tokenizer``: already built in this process (no Ray)."""
        from toolrl.training.optimizer import OptimizerSettings, adamw

        cfg = self.config
        self.sync_plan = (self.plan if self.plan is not None else run_plan(cfg)).sync
        self.delta = Delta() if self.sync_plan.delta else None
        on_gpu = cfg.ray.address is not None and cfg.ray.num_gpus_per_trainer > 0
        self.device = "cuda" if on_gpu else model_sources.resolve_device(cfg.model.device)
        if self.world_size > 1:
            from toolrl.training.sharding import join_group

            assert master is not None
            join_group(master, self.rank, self.world_size, self.device, cfg.trainer.collective_timeout_s)
        if model is None:
            seed_everything(cfg.trainer.seed)
            path = model_path(cfg)
            tokenizer = model_sources.load_tokenizer(path)
            model = build_policy(cfg, path, self.device)
        self.model = self.policy = model
        from toolrl.training.vision import is_vision_model

        if is_vision_model(model):
            self.processor = model_sources.load_processor(model_path(cfg))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        if self.loss.kl_coef > 0:  # copied before sharding: each rank runs the whole frozen reference
            import copy

            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        mesh = None
        if self.world_size > 1:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(self.device, (self.world_size,))
            from toolrl.training.sequence_parallel import new_groups

            self.sp = new_groups(self.rank, self.world_size, cfg.trainer.sequence_parallel)
        if cfg.critic is not None:  # its backbone copied before sharding; sharded like the policy
            from toolrl.training.critic import Critic

            self.critic = Critic.build(cfg, model, self.device, self.pad_id, self.rank, self.world_size, mesh,
                                       self.processor)
        if mesh is not None:
            from toolrl.training.sharding import shard

            self.policy = shard(model, mesh, offload=cfg.trainer.cpu_offload)
        # Under model.adapters a group per trained adapter, at its lr: an adapter no row of an update used
        # has no gradient then, and AdamW leaves its weights and state (moments, step) as they were.
        settings = OptimizerSettings(lr=cfg.optim.lr, betas=cfg.optim.betas, eps=cfg.optim.eps,
                                     weight_decay=cfg.optim.weight_decay)
        self.optimizer = adamw(lora.param_groups(self.policy, cfg.model.adapters, cfg.optim.lr), settings)
        return actor_info(self.rank, self.device)

    # ----------------------------------------------------------------- training

    def step(self, trajectories: Sequence[Trajectory]) -> dict[str, Any]:
        """One GRPO update on the whole batch (this rank trains its share); metrics, as on rank 0,
        ``advantages`` (per trajectory, for the traces) and ``trainer_logprobs`` (by trajectory id, of
        the trajectories this rank trained: :func:`toolrl.training.step.train_step`)."""
        from toolrl.training.sharding import state_bytes
        from toolrl.training.step import StepOptions, advantage_inputs, train_step

        cfg = self.config
        options = StepOptions(cfg.algorithm, cfg.optim, pad_id=self.pad_id, temperature=cfg.rollout.temperature,
                              max_response_tokens=cfg.rollout.max_response_tokens, rank=self.rank,
                              world_size=self.world_size, estimator=self.estimator, loss=self.loss,
                              processor=self.processor, sp=self.sp, adapters=tuple(cfg.model.adapters or ()),
                              frozen=frozen_roles(cfg))
        # The fields the run gives beside its parts': the critic's values, for the estimator that reads them.
        given = {} if self.critic is None else {VALUES: self.critic.values(trajectories)}
        out = train_step(self.policy, self.optimizer, trajectories, options, ref_model=self.ref_model, fields=given)
        if self.critic is not None:  # regressed on the estimator's targets for the values it gave before the step
            inputs = advantage_inputs(trajectories, cfg.rollout.max_response_tokens, cfg.algorithm, given)
            returns = self.estimator.value_targets(inputs)
            out.update(self.critic.update(trajectories, given[VALUES], returns, inputs.response_mask))
        if self.world_size > 1:
            out = _group_metrics(out)
        self.model.eval()
        state = state_bytes(self.model, self.optimizer)
        if self.critic is not None:
            state += state_bytes(self.critic.model, self.critic.optimizer)
        out["trainer_state_mb"] = state / 2**20
        return out

    # ----------------------------------------------------------------- weights out

    def open_weight_link(self, transport: Any, key: str, receivers: int, timeout_s: float) -> Any:
        """This rank's end of a new link over ``transport`` (a :class:`toolrl.transports.LinkedTransport`)
        to ``receivers`` engines (the link before closed); what the receivers need to join it."""
        if self.link is not None:
            self.link.close()
        self.link = transport.open_sender(f"{key}-{self.rank}", self.rank, receivers, timeout_s)
        self._delta_for((self.link.link.key,))
        return self.link.link

    def send_weights(self, bucket_mb: float) -> dict[str, Any]:
        """The shards this rank owns over its link (:meth:`open_weight_link`); the sync's metrics, and
        under ``error`` why the transfer failed (a receiver died or stalled: the controller opens new
        links, whose receivers get every weight)."""
        try:
            stats = send_owned(self.model, self.link, self.rank, self.world_size, bucket_mb, self.sync_plan, self.delta)
        except TransportError as exc:
            self._delta_done(False)
            return {"weight_sync_s": 0.0, "weight_sync_peak_mb": 0.0, "error": str(exc)}
        self._delta_done(True)
        return stats.as_metrics()

    def push_to_engines(self, engines: Sequence[Any]) -> dict[str, float]:
        """The weights as rows into engines in this process (nothing copied for an engine sharing the
        module), which the caller holds in ``updating_weights``."""
        self._delta_for(tuple(str(id(e)) for e in engines))
        stats = push_local(self.model, engines, self.sync_plan, self.delta)
        self._delta_done(True)
        return stats.as_metrics()

    def _delta_for(self, receivers: tuple[str, ...]) -> None:
        """Delta sync to ``receivers``: other receivers than the last sync's get every weight."""
        if self.delta is not None and receivers != self.delta_receivers:
            self.delta.reset()
            self.delta_receivers = receivers

    def _delta_done(self, ok: bool) -> None:
        """After a sync: what it sent is what the receivers hold (``ok``), or they get everything next."""
        if self.delta is not None and ok:
            self.delta.commit()
        elif self.delta is not None:
            self.delta.reset()

    # ----------------------------------------------------------------- checkpoints

    def _state(self) -> dict[str, Any]:
        """What a checkpoint holds: the trained parameters (only the adapters under LoRA; the frozen
        base comes from ``model.source`` again), the frozen adapters (``model.adapters``) and the
        optimizer state."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer,
                                            options=StateDictOptions(ignore_frozen_params=True))
        # A frozen tensor under a second name (a tied LM head) slips through ignore_frozen_params.
        frozen = {n for n, p in self.model.named_parameters(remove_duplicate=False) if not p.requires_grad}
        state = {"model": {k: v for k, v in model_sd.items() if k not in frozen}, "optim": optim_sd}
        # The frozen adapters' own tensors: a load (or restore) fills them in place, as set_state_dict
        # (which skips frozen parameters) does not.
        state["model"].update(lora.frozen_adapter_state_dict(self.model))
        if self.critic is not None:
            state.update(self.critic.state())
        return state

    def save(self, directory: str) -> None:
        """Write this rank's shards (and RNG) into ``directory``; all ranks call it together."""
        import torch
        import torch.distributed.checkpoint as dcp

        Path(directory).mkdir(parents=True, exist_ok=True)
        dcp.save(self._state(), checkpoint_id=directory, no_dist=self.world_size == 1)
        torch.save(torch.get_rng_state(), Path(directory) / f"rng_rank{self.rank}.pt")

    def load(self, directory: str) -> None:
        """Load a checkpoint written by any number of ranks (DCP reshards to this world size)."""
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        state = self._state()
        try:  # a truncated shard, or a checkpoint of a model of another shape
            dcp.load(state, checkpoint_id=directory, no_dist=self.world_size == 1)
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"],
                           options=StateDictOptions(ignore_frozen_params=True, strict=False))
        except (Exception, CheckpointException) as exc:  # DCP's exception is no Exception subclass
            # DCP's message holds each rank's traceback: say what went wrong on the first, in one line.
            cause = next(iter(exc.failures.values()))[0] if isinstance(exc, CheckpointException) else exc
            raise ConfigError(f"--resume: {directory}: the trainer's state cannot be loaded into this model "
                              f"({type(cause).__name__}: {one_line(str(cause))[:300]})") from None
        if self.critic is not None:
            self.critic.load(state)
        rng = Path(directory) / f"rng_rank{self.rank}.pt"
        torch.set_rng_state(torch.load(rng if rng.exists() else Path(directory) / "rng_rank0.pt"))

    def snapshot(self) -> tuple[dict[str, float], dict[str, Any]]:
        """This rank's in-memory copy after a step (:mod:`toolrl.processes.rank_state`), and what it cost:
        the group keeps the copy in Ray's object store to re-form without a checkpoint. Called on the
        actor's ``copy`` concurrency group, beside the group's other calls (which only read meanwhile)."""
        t0 = time.perf_counter()
        copy = rank_state.snapshot(self._state())
        return {"snapshot_s": time.perf_counter() - t0}, copy

    def hold_copies(self, step: int, copies: Sequence[Any]) -> None:
        """Pull other ranks' copies after ``step`` (object refs owned by the controller) into this
        node's object store and keep them, so they outlive the node they were made on: Ray finds a
        lost object's other copies and pins one (:func:`toolrl.processes.recovery.peer_holders`)."""
        import ray

        self.held[step] = ray.get(list(copies))  # arrays read in place: the store keeps them while held

    def release_copies(self, keep: int) -> None:
        """Drop the copies held from the steps before ``keep`` (the controller uses newer ones now)."""
        self.held = {s: c for s, c in self.held.items() if s >= keep}

    def restore(self, copies: Sequence[Any]) -> None:
        """Take the state of the old group's in-memory copies (object refs, one per old rank, in rank
        order; another number of ranks is resharded)."""
        import ray
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        state = self._state()
        wanted = rank_state.needed(len(copies), self.world_size, self.rank)
        fetched = dict(zip(wanted, ray.get([copies[i] for i in wanted]), strict=True))
        rank_state.restore(state, [fetched.get(i) for i in range(len(copies))], self.rank)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(ignore_frozen_params=True, strict=False))
        if self.critic is not None:
            self.critic.load(state)

    def close(self) -> None:
        import torch.distributed as dist

        if self.link is not None:
            self.link.close()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


# Metrics that train_step reports for this rank's share, and how the group's figure is made of them.
# The critic trains over the same shares as the policy, so its value_tokens equal loss_tokens.
_SUMMED = ("loss", "trainer_tokens_per_s", "loss_tokens", "value_loss", "value_tokens", "trainer_tokens_computed",
           "trainer_tokens_total", "critic_tokens_computed", "critic_tokens_total")
_TOKEN_MEANS = ("clip_frac", "kl", "lp_mismatch", "is_weight_mean", "is_truncated_frac",
                "value_clip_frac", "is_masked_frac", "mismatch_kl")  # weighted by loss_tokens
_AVERAGED = ("padding_fraction", "is_ratio_p05", "is_ratio_p50", "is_ratio_p95", "routing_mismatch_frac")  # quantiles: the ranks' mean
_LARGEST = ("trainer_peak_mb", "is_weight_max")


def _group_metrics(out: dict[str, float]) -> dict[str, float]:
    """The whole group's step metrics from every rank's (all ranks call this together): shares of the
    loss, throughput and loss tokens add up; token means are weighted by each rank's ``loss_tokens``
    (so they are the means over the whole batch's tokens, as on one rank); other means are averaged
    over the ranks that have them; extremes are the group's (peak memory is the largest rank's).
    ``grad_norm`` and ``trained_tokens`` are already global."""
    import torch
    import torch.distributed as dist

    tokens = out.get("loss_tokens", 0.0)
    values = [out.get(k, 0.0) for k in _SUMMED]
    for k in _TOKEN_MEANS:
        values += [out.get(k, 0.0) * tokens, tokens if k in out else 0.0]
    for k in _AVERAGED:
        values += [out.get(k, 0.0), float(k in out)]
    summed = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(summed)
    # The minimum is the negated maximum of the negated values: one MAX reduction for every extreme.
    extremes = torch.tensor([out.get(k, -math.inf) for k in _LARGEST] + [-out.get("is_weight_min", math.inf)],
                            dtype=torch.float64)
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
    group = dict(out)
    group.update((k, v) for k, v in zip(_SUMMED, summed[:len(_SUMMED)].tolist(), strict=True) if k in out)
    pairs = summed[len(_SUMMED):].view(-1, 2).tolist()
    for k, (total, weight) in zip(_TOKEN_MEANS + _AVERAGED, pairs, strict=True):
        if weight:
            group[k] = total / weight
    largest = extremes.tolist()
    for k, v in zip(_LARGEST, largest, strict=False):
        if v > -math.inf:
            group[k] = v
    if largest[-1] > -math.inf:
        group["is_weight_min"] = -largest[-1]
    for share, prefix in (("prefix_share", "trainer"), ("critic_prefix_share", "critic")):
        if group.get(f"{prefix}_tokens_total"):
            group[share] = 1.0 - group[f"{prefix}_tokens_computed"] / group[f"{prefix}_tokens_total"]
    return group
