"""A trainer rank's in-memory copy (toolrl.processes.rank_state) on a real gloo process group with FSDP2
(two processes on loopback, no Ray): the copies of a trained two-rank group, put into a freshly
built group of two, give every rank exactly its parameters and AdamW state back; put into one rank
(a shrink), they give the whole tensors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


def build(seed: int):
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))  # 5 rows: uneven over 2 ranks
    return model


def train_once(model, optimizer) -> None:
    torch.manual_seed(7)
    loss = model(torch.randn(4, 6)).pow(2).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def state(model, optimizer):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def put_back(model, optimizer, filled) -> None:
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, optimizer, model_state_dict=filled["model"], optim_state_dict=filled["optim"])


def flat(value, prefix=""):
    """Every tensor of a state dict by dotted path, DTensors as their local pieces."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}{key}.").items()}
    if isinstance(value, list | tuple):
        return {k: v for i, item in enumerate(value) for k, v in flat(item, f"{prefix}{i}.").items()}
    if isinstance(value, DTensor):
        return {prefix: value.to_local().detach().clone()}
    if isinstance(value, torch.Tensor):
        return {prefix: value.detach().clone()}
    return {}


def group(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as dist
    from toolrl.processes import rank_state
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))

    def sharded(seed):
        model = build(seed)
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), lr=0.1)

    model, optimizer = sharded(0)
    train_once(model, optimizer)
    torch.manual_seed(1234 + rank)  # each rank's RNG comes back too
    copy = rank_state.snapshot(state(model, optimizer))
    want = flat(state(model, optimizer))
    full = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    torch.save({"copy": copy, "full": full, "rng": torch.get_rng_state()}, Path(out) / f"rank{rank}.pt")
    dist.barrier()
    copies = [torch.load(Path(out) / f"rank{r}.pt", weights_only=False)["copy"] for r in range(world)]
    # A fresh group (other initial weights, no optimizer state yet) takes only its own copy.
    fresh, fresh_opt = sharded(99)
    filled = state(fresh, fresh_opt)
    rank_state.restore(filled, [c if r == rank else None for r, c in enumerate(copies)], rank)
    put_back(fresh, fresh_opt, filled)
    got = flat(state(fresh, fresh_opt))
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want), [k for k in want if not torch.equal(got[k], want[k])]
    assert torch.equal(torch.get_rng_state(), copies[rank]["rng"])
    # The restored group trains on exactly like the original.
    train_once(model, optimizer)
    train_once(fresh, fresh_opt)
    assert all(torch.equal(a.to_local(), b.to_local()) for a, b in zip(model.parameters(), fresh.parameters()))
    # Both ranks done with every collective before either tears gloo down: a rank that destroyed its group
    # while the other still had traffic in flight once took that one down with SIGABRT (a cold CI run).
    dist.barrier()
    dist.destroy_process_group()


def test_copies_restore_a_group_of_the_same_size_exactly_and_reshard_to_one_rank(tmp_path):
    from _processes import start_ranks
    from toolrl.processes import rank_state

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start_ranks(group, (2, str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    saved = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    # Shrink: one rank, no process group, from both ranks' copies (pieces cut from the whole).
    model = build(99)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    filled = state(model, optimizer)
    rank_state.restore(filled, [s["copy"] for s in saved], 0)
    put_back(model, optimizer, filled)
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), saved[0]["full"][name]), name
    moments = [optimizer.state[p]["exp_avg"] for p in model.parameters()]
    assert all(m.abs().sum() > 0 for m in moments)  # Adam's state came back, whole
    assert torch.equal(torch.get_rng_state(), saved[0]["copy"]["rng"])


def test_each_copy_is_held_on_another_node_and_on_one_node_none_is():
    """Who pulls whose copy after a step (toolrl.processes.recovery.peer_holders): a rank of the next
    node, the copies spread evenly; nobody when every rank shares a node (nothing changes there)."""
    from toolrl.processes.recovery import peer_holders

    assert peer_holders(["a", "a"]) == {} and peer_holders(["a"]) == {} and peer_holders([]) == {}
    assert peer_holders(["a", "b"]) == {0: [1], 1: [0]}
    assert peer_holders(["a", "a", "b", "b"]) == {0: [2], 1: [3], 2: [0], 3: [1]}
    assert peer_holders(["a", "b", "a", "b"]) == {0: [1], 1: [0], 2: [3], 3: [2]}
    assert peer_holders(["a", "b", "c"]) == {0: [2], 1: [0], 2: [1]}
    assert peer_holders(["a", "a", "a", "b"]) == {0: [3], 3: [0, 1, 2]}  # the lone rank of b holds all of a's
    assert peer_holders(["a", None, "b"]) == {0: [2], 2: [0]}  # a rank of unknown node: neither sends nor holds
    for nodes in (["a", "b", "c"], ["a", "a", "b", "b", "c"], ["x", "y", "x", "z"]):  # each copy on another node
        held = {src: h for h, srcs in peer_holders(nodes).items() for src in srcs}
        assert sorted(held) == list(range(len(nodes))) and all(nodes[h] != nodes[s] for s, h in held.items())
