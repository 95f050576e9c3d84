"""benchmarks/tinker.py's in-process anchors call the plugin's own step as the server does (it broke once
when forward_backward gained its micro-batch argument, unnoticed until the benchmark was rerun) and its
sampler engine, one request per adapter; the sampler's packed linears."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "tinker.py"


def test_the_in_process_anchor_runs_the_served_step(monkeypatch) -> None:
    import torch
    from toolrl_tinker.adapters import ATTN, MLP
    from toolrl_tinker.bases import Base
    from toolrl_tinker.trainer import Run

    monkeypatch.syspath_prepend(str(BENCH.parent))  # its _common
    threads = torch.get_num_threads()
    spec = importlib.util.spec_from_file_location("tinker_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(bench)  # a benchmark runs on one thread
    finally:
        torch.set_num_threads(threads)
    base = Base.load("tiny-qwen3")
    runs = [Run(f"bench:train:{i}", "me", base.name, 4, ATTN + MLP, i) for i in range(2)]
    adapters = bench.local_samplers(base, runs)  # each run's adapter on the sampler, as the engine-alone anchor has
    run = runs[0]
    before = base.trainer.adapter_state(run)
    assert bench.in_process_step(base.trainer, run, bench.as_request(bench.datums(2, 8))) > 0
    assert run.steps == 1
    assert any(not (t == before[n]).all() for n, t in base.trainer.adapter_state(run).items())  # the step moved it
    assert bench.engine_rows(base.sampler.engine, adapters, 1, 3) > 0  # the engine-alone anchor: a request per adapter


def test_the_sampler_decodes_on_packed_linears() -> None:
    """Several clients' rows decode together on oneDNN-packed weights: the four clients' sampling gain
    (2.86 against 2.33 on dense ones, docs/benchmarks.md) rests on it."""
    from toolrl.modeling.packed_linears import PackedLinears
    from toolrl_tinker.bases import Base

    base = Base.load("tiny-qwen3")
    engine = base.sampler.engine
    assert engine.config.packed_linears
    packed = {id(m) for m in engine._packed.layers}
    assert isinstance(engine._packed, PackedLinears) and id(engine.model.get_output_embeddings()) in packed
    assert not any(id(m) in packed for m in base.trainer.ranks.model.modules())  # the trainer's copy stays dense
