"""A sync over the object store: small row-sharded tensors are gathered in one all-gather
(:func:`toolrl.training.weight_sync.gather_rows`), byte for byte what ``full_tensor()`` gives each, on
two real gloo ranks; a bucket's small tensors travel packed into one byte tensor (:class:`PackedBucket`)."""

from __future__ import annotations

import pytest
import torch
from _processes import spawn_ranks
from toolrl.config import LoraConfig
from toolrl.model_sources import load_model
from toolrl.training.lora import apply_lora
from toolrl.training.sharding import shard
from toolrl.training.weight_sync import (
    PACK_SMALL,
    Delta,
    PackedBucket,
    SyncPlan,
    SyncStats,
    gather_rows,
    iter_buckets,
)
from toolrl.transports import BucketHeader


def _rank(rank: int, port: int, path: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        # Rows that split unevenly (3 = 2 + 1; 1 = 1 + 0) and dtypes of every width, packed together.
        whole = [torch.arange(15, dtype=torch.float32).view(3, 5), torch.tensor([[7, 8]], dtype=torch.int64),
                 torch.arange(6, dtype=torch.bfloat16), torch.arange(8, dtype=torch.uint8).view(4, 2)]
        sharded = [distribute_tensor(t, mesh, [Shard(0)]) for t in whole]
        odd = [torch.equal(g, t) and g.dtype == t.dtype for g, t in zip(gather_rows(sharded), whole, strict=True)]

        model = load_model(path)
        apply_lora(model, LoraConfig(r=4, alpha=8))
        with torch.no_grad():  # adapters that differ from their initial values (lora_B starts at 0)
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
        shard(model, mesh)  # in place: the trainer rank syncs the model itself
        want = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).clone() for k, v in model.state_dict().items()}
        got = {}
        for plan in (SyncPlan(adapters=True), SyncPlan()):
            stats = SyncStats()
            for bucket, _ in iter_buckets(model, 1 << 20, stats, keep=rank == 0, plan=plan):
                got.update({(plan.adapters, k): v.clone() for k, v in bucket.items()})
        # Delta: the ranks agree on what changed (one all-reduce) before gathering; a tensor written on
        # one rank only (its own rows) is still sent, or the gathers would not match up.
        delta, sent = Delta(), []
        for write in (None, "model.norm.weight", None):
            if write is not None and rank == 1:
                with torch.no_grad():
                    dict(model.named_parameters())[write].mul_(1.0)
            names = []
            lasts = []
            for bucket, last in iter_buckets(model, 1 << 20, SyncStats(), keep=rank == 0, delta=delta):
                names += list(bucket)
                lasts.append(last)
            assert lasts == ([False] * (len(lasts) - 1) + [True] if lasts else [])  # the final one marked
            delta.commit()
            sent.append(names)
        if rank == 0:
            torch.save({"odd": odd, "want": want, "got": got, "sent": sent}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes over gloo: a minute on a loaded 2-core machine
def test_batched_gathers_equal_full_tensor_byte_for_byte(tiny_qwen3_path, tmp_path):
    out = tmp_path / "gathered.pt"
    spawn_ranks(_rank, 2, tiny_qwen3_path, str(out))
    result = torch.load(out)
    assert result["odd"] == [True] * 4
    want, got = result["want"], result["got"]
    adapters = {k for (a, k) in got if a}
    assert adapters and all("lora_" in k for k in adapters)
    assert adapters == {k for k in want if "lora_" in k}
    for name in adapters:
        assert torch.equal(got[(True, name)], want[name]), name
    # The full sync: base names, LoRA merged in (tested against the merge in test_lora); every one sent.
    merged = {k for (a, k) in got if not a}
    assert merged and not any("lora_" in k or "base_layer" in k for k in merged)
    for name in merged & set(want):  # tensors LoRA does not touch travel as they are
        assert torch.equal(got[(False, name)], want[name]), name
    first, written, idle = result["sent"]
    always = {n for n in merged if n not in want}  # adapted weights: merged anew every sync, always sent
    assert always and set(first) == merged  # everything; then what rank 1 alone wrote; then nothing more
    assert set(written) == always | {"model.norm.weight"} and set(idle) == always


def test_a_packed_bucket_gives_back_every_tensor_bit_for_bit():
    big = torch.randn(PACK_SMALL // 4 + 1)  # one element past the packing limit: travels as it is
    bucket = {"a": torch.randn(3, 5), "b": torch.tensor(2.5), "c": torch.arange(7, dtype=torch.int64),
              "d": torch.randn(4, 2).to(torch.bfloat16), "big": big}
    packed = PackedBucket.pack(bucket)
    pieces = BucketHeader.model_validate_json(packed.header).pieces
    assert [p.name for p in pieces] == ["a", "b", "c", "d"] and packed.whole["big"] is big
    assert all(p.offset % 64 == 0 for p in pieces)
    got = packed.tensors()
    assert set(got) == set(bucket)
    for name, tensor in bucket.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape and torch.equal(got[name], tensor)
    assert PackedBucket.pack({}).tensors() == {}
