"""One rank of a trainer outside toolrl's loop: a base model with named LoRA adapters on it, each with its
own AdamW, stepped by the public step (:func:`toolrl.training.token_step.forward_backward`,
:func:`toolrl.training.optimizer.optimizer_step`) through one adapter at a time. In the caller's process
(one rank, no Ray), or as one of a :class:`toolrl.processes.step_group.StepGroup`'s Ray actors, where it
shards the frozen base with FSDP2 and holds every adapter and its AdamW whole: a backward's gradient is
all-reduced at once, so every rank makes the same optimizer step and the adapters are never sent. With
``slots`` the least recently used adapters move to host memory; every rank makes the same calls, so
the same moves. The calls, slots and replication: docs/training_api.md "Several ranks". ``torch`` is
imported inside the methods.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolrl.config import AdapterConfig
from toolrl.model_sources import load_model
from toolrl.modeling.adapter_residency import AdapterResidency, host_copy
from toolrl.modeling.adapters import adapter_parameters, add_adapter, load_adapter_state, remove_adapter
from toolrl.processes.ray_actors import actor_info, rendezvous_address
from toolrl.training.optimizer import OptimizerSettings, adamw, optimizer_step
from toolrl.training.token_step import LossSpec, StepOutput, TokenRow, forward_backward

__all__ = ["StepRank"]

# AdamW's settings until an adapter's first optimizer step, which brings its own (as each step does).
START = OptimizerSettings(lr=1e-4)


@dataclass
class _Parked:
    """An adapter out of the model (:class:`StepRank`'s slots): its weights, gradient (None: none pending)
    and AdamW state, in host memory."""

    weights: dict[str, Any]
    grads: dict[str, Any]
    optimizer: dict[str, Any]


class StepRank:
    """Rank ``rank`` of ``world_size``: the causal LM at ``source`` (a model directory), its adapters and
    their optimizers. ``device``: where it computes ("cuda": NCCL between ranks, else gloo). ``slots``:
    at most this many adapters in the model (None: all). Call :meth:`setup` first."""

    def __init__(self, source: str, rank: int = 0, world_size: int = 1, device: str = "cpu",
                 slots: int | None = None, collective_timeout_s: float = 600.0) -> None:
        if slots is not None and slots < 1:
            raise ValueError(f"slots={slots}: at least one adapter must fit in the model")
        self.source, self.rank, self.world_size, self.device = source, rank, world_size, device
        self.collective_timeout_s = collective_timeout_s
        self.model: Any = None  # the causal LM (its base's parameters DTensors when sharded)
        self.policy: Any = None  # what the step runs: the model, or the FSDP root around it
        self.optimizers: dict[str, Any] = {}  # adapter -> its AdamW, for the adapters in the model
        self.configs: dict[str, AdapterConfig] = {}
        self.residency: AdapterResidency[_Parked] = AdapterResidency(slots, self._park, self._unpark)

    def address(self) -> tuple[str, int]:
        """Where rank 0 hosts the process group's rendezvous (this node, a free port)."""
        return rendezvous_address()

    def setup(self, master: tuple[str, int] | None = None) -> dict[str, Any]:
        """Load the model (join the group at ``master`` and shard it, with several ranks); where this rank
        runs and the model's ``arch``, ``vocab`` and ``context`` (its longest sequence)."""
        if self.world_size > 1:
            from toolrl.training.sharding import join_group

            assert master is not None
            join_group(master, self.rank, self.world_size, self.device, self.collective_timeout_s)
        self.model = self.policy = load_model(self.source, dtype="float32", device=self.device)
        self.model.config.use_cache = False
        if self.world_size > 1:
            from torch.distributed.device_mesh import init_device_mesh

            from toolrl.training.sharding import shard

            self.policy = shard(self.model, init_device_mesh(self.device, (self.world_size,)))
        config = self.model.config
        return {**actor_info(self.rank, self.device), "arch": type(self.model).__name__,
                "vocab": int(self.model.get_output_embeddings().weight.shape[0]),
                "context": int(getattr(config, "max_position_embeddings", 0) or 1 << 20)}

    # ----------------------------------------------------------------- adapters

    def add_adapter(self, name: str, config: AdapterConfig, seed: int | None = None) -> None:
        """Adapter ``name`` (:func:`toolrl.modeling.adapters.add_adapter`, initialised from ``seed``) and a
        fresh AdamW for it."""
        if name in self.configs:
            raise ValueError(f"adapter {name!r} exists already")
        self.residency.make_room(1)
        add_adapter(self.model, name, config, seed=seed)
        self.configs[name] = config
        self.optimizers[name] = adamw(self._params(name), START)
        self.residency.resident[name] = None

    def remove_adapter(self, name: str) -> None:
        """Adapter ``name`` off the model (or out of host memory), its AdamW with it."""
        self._known(name)
        if self.residency.parked.pop(name, None) is None:
            remove_adapter(self.model, name)
            del self.optimizers[name], self.residency.resident[name]
        del self.configs[name]

    # ----------------------------------------------------------------- the step

    def forward_backward(self, name: str, rows: Sequence[TokenRow], loss: LossSpec, *, backward: bool = True,
                         max_tokens: int | None = None, forwards: int = 0) -> StepOutput:
        """:func:`toolrl.training.token_step.forward_backward` of this rank's ``rows`` through adapter
        ``name`` (``forwards``: at least that many, as every rank of the group runs); with several ranks
        the gradient it adds is the sum over the group's rows."""
        import torch
        import torch.distributed as dist

        self._resident(name)
        params = adapter_parameters(self.model, name)
        summed = backward and self.world_size > 1
        held = {k: p.grad for k, p in params.items()}
        if summed:  # the gradient added by this call alone is summed over the ranks
            for p in params.values():
                p.grad = None
        out = forward_backward(self.policy, rows, loss, adapter=name, backward=backward, max_tokens=max_tokens,
                               forwards=forwards)
        if summed:
            flat = torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1) for p in params.values()])
            dist.all_reduce(flat)
            for (key, p), piece in zip(params.items(), flat.split([p.numel() for p in params.values()]), strict=True):
                p.grad = piece.view_as(p) if held[key] is None else held[key] + piece.view_as(p)
        return out

    def optimizer_step(self, name: str, settings: OptimizerSettings) -> float:
        """:func:`toolrl.training.optimizer.optimizer_step` of adapter ``name``'s AdamW."""
        self._resident(name)
        return optimizer_step(self.optimizers[name], settings)

    # ----------------------------------------------------------------- state

    def state(self, name: str, optimizer: bool = True) -> dict[str, Any]:
        """Copies of adapter ``name``'s weights (``adapter``: by :func:`toolrl.modeling.adapters.adapter_state`'s
        names) and, with ``optimizer``, its AdamW's ``state_dict`` (``optimizer``; else None)."""
        self._resident(name)
        weights = {k: p.detach().to("cpu", copy=True) for k, p in adapter_parameters(self.model, name).items()}
        moments = host_copy(copy.deepcopy(self.optimizers[name].state_dict()), pin=False) if optimizer else None
        return {"adapter": weights, "optimizer": moments}

    def gradients(self, name: str) -> dict[str, Any]:
        """Copies of adapter ``name``'s gradients by the weights' names (None: no gradient pending)."""
        self._resident(name)
        return {k: None if p.grad is None else p.grad.detach().to("cpu", copy=True)
                for k, p in adapter_parameters(self.model, name).items()}

    def set_gradients(self, name: str, grads: Mapping[str, Any]) -> None:
        """Adapter ``name``'s pending gradients set to ``grads`` (:meth:`gradients`' copies): a request that
        fails after some of its backward calls is undone."""
        self._resident(name)
        for key, p in adapter_parameters(self.model, name).items():
            p.grad = None if grads[key] is None else grads[key].to(p.device, p.dtype, copy=True)

    def load_state(self, name: str, adapter: Mapping[str, Any], optimizer: Mapping[str, Any] | None = None) -> None:
        """Adapter ``name``'s weights from ``adapter`` and its AdamW's state from ``optimizer`` (None: a
        fresh AdamW); its gradient cleared. Raises ValueError, nothing changed, when either does not fit."""
        self._resident(name)
        params = self._params(name)
        fresh = adamw(params, START)
        if optimizer is not None:
            fresh.load_state_dict(copy.deepcopy(dict(optimizer)))
        load_adapter_state(self.model, name, adapter)
        for p in params:
            p.grad = None
        self.optimizers[name] = fresh

    def memory(self) -> dict[str, int]:
        """Tensor bytes this rank holds, by part: ``weights`` (its shard of the base), ``adapters``, their
        pending ``gradients``, their AdamW moments (``optimizer``), and ``host``: adapters moved out."""
        import torch

        def size(t: Any) -> int:
            return int(t.numel()) * t.element_size() if isinstance(t, torch.Tensor) else 0

        parts = dict.fromkeys(("weights", "adapters", "gradients", "optimizer", "host"), 0)
        for key, p in self.model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p  # a shard's own bytes
            parts["adapters" if ".lora_" in key else "weights"] += size(local)
            parts["gradients"] += size(p.grad)
        parts["weights"] += sum(size(b) for b in self.model.buffers())
        parts["optimizer"] = sum(size(t) for o in self.optimizers.values() for st in o.state.values() for t in st.values())
        parts["host"] = sum(size(t) for k in self.residency.parked.values()
                            for t in (*k.weights.values(), *k.grads.values(),
                                      *(v for st in k.optimizer["state"].values() for v in st.values())))
        return parts

    def close(self) -> None:
        import torch.distributed as dist

        if self.world_size > 1 and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    # ----------------------------------------------------------------- slots

    def _known(self, name: str) -> None:
        if name not in self.configs:
            raise ValueError(f"no adapter {name!r}: this trainer holds {', '.join(self.configs) or 'none'}")

    def _params(self, name: str) -> list[Any]:
        return list(adapter_parameters(self.model, name).values())

    def _resident(self, name: str) -> None:
        """Adapter ``name`` in the model (brought back from host memory when parked) and the most recently used."""
        self._known(name)
        self.residency.bring({name})

    def _park(self, name: str) -> _Parked:
        """Adapter ``name`` out of the model: its weights, gradient and AdamW state on the host (pinned on a GPU)."""
        import torch

        pin = torch.device(self.device).type == "cuda"
        params = adapter_parameters(self.model, name)
        parked = _Parked({k: host_copy(p.detach(), pin) for k, p in params.items()},
                         {k: host_copy(p.grad, pin) for k, p in params.items()},
                         host_copy(self.optimizers.pop(name).state_dict(), pin))
        remove_adapter(self.model, name)
        return parked

    def _unpark(self, name: str, parked: _Parked) -> None:
        add_adapter(self.model, name, self.configs[name], seed=0)  # its weights come next: the process's RNG untouched
        load_adapter_state(self.model, name, parked.weights)
        params = adapter_parameters(self.model, name)
        for key, p in params.items():
            grad = parked.grads[key]
            p.grad = None if grad is None else grad.to(p.device, copy=True)
        optimizer = adamw(list(params.values()), START)
        optimizer.load_state_dict(parked.optimizer)
        self.optimizers[name] = optimizer
