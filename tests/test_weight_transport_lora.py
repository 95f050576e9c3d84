"""LoRA adapter-only weight sync: the trainer sends only the adapter tensors and the transformers engine
applies them as adapters on its own base model (no merged copy), over every transport; its log-probs
then equal those of an engine given the merged weights, within fp32 noise."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from test_weight_transport import LINKED, PROMPTS, logprobs, transport
from toolrl.config import ConfigError, LoraConfig, load_config
from toolrl.engines import ModelSource, RolloutEngine
from toolrl.engines.transformers import TransformersEngine
from toolrl.model_sources import load_model
from toolrl.modeling.adapters import apply_lora
from toolrl.processes.resolve import run_plan
from toolrl.training.lora import iter_adapter_weights
from toolrl.training.weight_sync import (
    Delta,
    SyncPlan,
    SyncStats,
    prepare_engine,
    push_local,
    send_owned,
)
from toolrl.transports.weight_rows import receive_into

LORA = LoraConfig(r=4, alpha=8.0)
TINY = str(Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml")
# fp32 noise: x·(W + s·B·A) (merged) and x·W + s·(x·A)·B (adapters) round differently; on the tiny
# model the sampled log-probs came out equal (its logits differ by < 1e-6); the bound leaves room.
LOGPROB_ATOL = 1e-5


def sync(name: str, model: Any, engines: Sequence[RolloutEngine], version: int, plan: SyncPlan, tmp_path: Path,
         deltas: Sequence[Delta | None] = (None, None), key: str = "") -> int:
    """One sync of ``model`` to ``engines`` over transport ``name`` from two senders (ranks 0 and 1),
    or, for ``in_process``, as rows straight into them (the trainer's own process: no transport);
    returns the bytes the senders sent."""
    if name == "in_process":
        with updating(engines, version):
            return push_local(model, engines, plan, deltas[0]).bytes_sent
    kind = transport(name, tmp_path)
    senders = [kind.open_sender(f"{key or name}-{version}-{r}", r, len(engines), 30.0) for r in range(2)]
    stats = [SyncStats(), SyncStats()]
    errors: list[BaseException] = []

    def run(fn: Callable[[], Any]) -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    def send(r: int) -> None:
        stats[r] = send_owned(model, senders[r], r, 2, 0.05, plan, deltas[r])

    threads = [threading.Thread(target=run, args=(functools.partial(send, r),)) for r in range(2)]
    threads += [threading.Thread(target=run, args=(lambda e=e, i=i: receive_into(
        e, [kind.open_receiver(s.link, i) for s in senders], version),)) for i, e in enumerate(engines)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        for s in senders:
            s.close()
    assert not errors, errors
    return sum(s.bytes_sent for s in stats)


@contextlib.contextmanager
def updating(engines: Sequence[RolloutEngine], version: int) -> Iterator[None]:
    """Every engine inside ``updating_weights(version)`` at once, as the in-process push holds them."""
    with contextlib.ExitStack() as stack:
        for e in engines:
            stack.enter_context(e.updating_weights(version))
        yield


@pytest.fixture(scope="module")
def adapted(tiny_qwen3_path):
    """A model with LoRA adapters one "step" away from their start (B no longer zero)."""
    model = load_model(tiny_qwen3_path, dtype="float32", device="cpu")
    apply_lora(model, LORA)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def engine(path: str, adapters: bool = False) -> TransformersEngine:
    built = TransformersEngine.create(ModelSource(path=path), {"device": "cpu"})
    if adapters:
        built.apply_adapters(functools.partial(apply_lora, config=LORA))
    return built


@pytest.mark.parametrize("name", ["in_process", *LINKED])
async def test_adapter_only_sync_equals_the_merged_weights_and_sends_only_the_adapters(name, adapted, tiny_qwen3_path,
                                                                                        tmp_path):
    merged, engines = engine(tiny_qwen3_path), [engine(tiny_qwen3_path, adapters=True) for _ in range(2)]
    base = {k: v.clone() for k, v in merged.model.state_dict().items()}
    try:
        before = await logprobs(engines[0], PROMPTS)
        with updating([merged], 1):
            push_local(adapted, [merged])  # the merged path: W + s·B·A under the base names
        sent = sync(name, adapted, engines, 1, SyncPlan(adapters=True), tmp_path)
        want = await logprobs(merged, PROMPTS)
        assert before != want  # the adapters change what the engine samples
        adapter_bytes = sum(t.numel() * t.element_size() for _, t in iter_adapter_weights(adapted))
        assert sent == adapter_bytes < sum(v.numel() * v.element_size() for v in base.values()) / 10
        for e in engines:
            assert e.weight_version == 1
            got = await logprobs(e, PROMPTS)
            assert [t for t, _ in got] == [t for t, _ in want]
            diff = max(abs(a - b) for (_, la), (_, lb) in zip(got, want, strict=True) for a, b in zip(la, lb, strict=True))
            assert diff <= LOGPROB_ATOL, diff
            # Applied as adapters: the base weights are the checkpoint's, untouched, and no merged copy.
            state = e.model.state_dict()
            for key, value in base.items():
                adapted_key = key.replace(".weight", ".base_layer.weight")
                assert torch.equal(state.get(adapted_key, state.get(key)), value), key
            assert not any(getattr(m, "merged", False) for m in e.model.modules())
    finally:
        for e in [merged, *engines]:
            await e.close()


def test_the_plan_sends_adapters_only_to_an_engine_that_loads_them():
    lora = load_config(TINY, ["model.lora={r: 4}"])
    assert run_plan(lora, engine_cls=TransformersEngine).sync == SyncPlan(adapters=True)
    assert run_plan(lora, engine_cls=RolloutEngine).sync == SyncPlan()  # an engine that loads no adapters: merged
    assert run_plan(load_config(TINY, []), engine_cls=TransformersEngine).sync == SyncPlan()
    assert run_plan(load_config(TINY, ["trainer.weight_sync=delta"])).sync == SyncPlan(delta=True)  # looked up by name
    scripted_delta = load_config(TINY, ["engine.name=scripted", "trainer.weight_sync=delta"])
    with pytest.raises(ConfigError, match=r"^override trainer.weight_sync=delta: trainer.weight_sync: delta needs an "
                                          r"engine .* the scripted engine"):
        run_plan(scripted_delta, engine_cls=RolloutEngine)
    # A run that trains nothing (toolrl rollout, eval) sends no sync: delta is not read.
    assert run_plan(scripted_delta, "rollout", engine_cls=RolloutEngine).sync == SyncPlan()


def test_prepare_engine_gives_the_engine_the_runs_adapters(tiny_qwen3_path, adapted):
    built = engine(tiny_qwen3_path)
    config = load_config(TINY, ["model.lora={r: 4, alpha: 8.0, dropout: 0.5}"])  # no dropout sampling
    prepare_engine(built, config, run_plan(config, engine_cls=type(built)).sync)
    names = {k for k in built.model.state_dict() if ".lora_" in k}
    assert names == {k for k, _ in iter_adapter_weights(adapted)}
    assert not any(m.training for m in built.model.modules()) and not any(p.requires_grad for p in built.model.parameters())
