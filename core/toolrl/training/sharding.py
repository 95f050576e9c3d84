"""FSDP2 for a trainer rank: each decoder layer is one sharded unit, everything else (embeddings, final
norm, a tied or untied LM head) is the root unit.

The root is :class:`toolrl.training.step.Policy`, a module whose ``forward`` computes the response
log-probabilities the loss needs. GRPO runs the base model and the LM head separately (logits only at
trained positions), so the root's forward must contain both calls: FSDP2 gathers a unit's parameters
in that unit's forward hook, and a call that bypasses the root would meet sharded parameters.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import torch

from toolrl.training.step import Policy


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The repeated blocks, by the class names the model declares unsplittable."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} declares no decoder layer classes (_no_split_modules)")
    return layers


def join_group(master: tuple[str, int], rank: int, world_size: int, device: str, timeout_s: float) -> None:
    """Join rank ``rank`` of ``world_size`` to the ``torch.distributed`` process group whose rank 0 hosts
    its rendezvous at ``master`` (host, port): NCCL on GPU, gloo on CPU; a collective that waits longer
    than ``timeout_s`` raises."""
    import torch.distributed as dist

    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://{master[0]}:{master[1]}",
                            rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))


def shard(model: Any, mesh: Any, *, offload: bool = False) -> Policy:
    """Shard ``model`` in place over ``mesh``; returns the root :class:`Policy` to run and optimise."""
    return shard_root(Policy(model), model, mesh, offload=offload)


def shard_root(root: torch.nn.Module, model: Any, mesh: Any, *, offload: bool = False) -> Any:
    """Shard each decoder layer of ``model`` (a submodule of ``root``), then ``root`` as the root unit;
    returns ``root``. The policy and the critic (:mod:`toolrl.training.critic`) are sharded alike.

    On GPU, compute in bf16 and reduce gradients in fp32; on CPU, parameters keep their dtype.
    Gradients are summed over ranks, not averaged: each rank's loss is already normalised by the
    whole mini-batch (see :func:`toolrl.training.step.train_step`), so the sum is the one-rank gradient.
    """
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        FSDPModule,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    on_gpu = mesh.device_type == "cuda"
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if on_gpu \
        else MixedPrecisionPolicy()
    options: dict[str, Any] = {"mesh": mesh, "offload_policy": CPUOffloadPolicy() if offload else OffloadPolicy()}
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=mp, **options)
    # The root's inputs are the batch: its engine log-probs, advantages and masks must stay fp32 (FSDP
    # would cast every floating tensor in them to bf16); the layers' inputs are activations.
    fully_shard(root, mp_policy=dataclasses.replace(mp, cast_forward_inputs=False), **options)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    return root


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor`` resident in this process (a DTensor's local shard)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def state_bytes(model: Any, optimizer: torch.optim.Optimizer) -> int:
    """Parameters + gradients + optimizer state held by this rank. Gradients are counted at the size
    of the trainable parameters (they are resident during the step, freed after it)."""
    params = {id(p): p for p in model.parameters()}.values()
    total = sum(local_bytes(p) * (2 if p.requires_grad else 1) for p in params)
    for state in optimizer.state.values():
        total += sum(local_bytes(v) for v in state.values() if isinstance(v, torch.Tensor))
    return total
