"""The transformers engine on the tiny random Qwen2.5-VL: prompts with images (batched, shared, and a
second turn that adds an image on top of the kept KV) match full forwards with the model's own 3-D
positions."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
import torch
from PIL import Image
from toolrl import model_sources
from toolrl.engines import ModelSource, SamplingParams
from toolrl.engines.transformers import TransformersEngine
from toolrl.renderers.chat import ChatRenderer
from toolrl.trajectory import TrajectoryImage

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)


def png(width, height, seed):
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def vlm():
    path = model_sources.tiny_qwen2_5_vl()
    processor = model_sources.load_processor(path)
    renderer = ChatRenderer(processor.tokenizer, chat_template=processor.chat_template, processor=processor)
    return path, model_sources.load_model(path), processor, renderer


def image(renderer, seed, size=(60, 40)):
    data = png(*size, seed)
    return TrajectoryImage(png=data, grid_thw=renderer.image_grid(data))


@torch.no_grad()
def reference(model, processor, ids, images, steps):
    """Greedy decoding by full forwards (no KV cache), the model computing its own 3-D positions."""
    from toolrl.images import from_png

    pixels = processor.image_processor(images=[from_png(i.png) for i in images], return_tensors="pt") if images else {}
    ids, out, logprobs = list(ids), [], []
    pad = model.config.image_token_id
    for _ in range(steps):
        input_ids = torch.tensor([ids])
        model.model.rope_deltas = None
        logits = model(input_ids=input_ids, mm_token_type_ids=(input_ids == pad).int(), **pixels).logits[0, -1]
        token = int(logits.argmax())
        out.append(token)
        logprobs.append(float(torch.log_softmax(logits.float(), -1)[token]))
        ids.append(token)
    return out, logprobs


def prompt(renderer, text, images):
    messages = [{"role": "user", "content": [{"type": "image"}] * len(images) + [{"type": "text", "text": text}]}]
    return renderer.prompt_ids(messages, [i.grid_thw for i in images])


async def test_prompts_with_images_match_full_forwards(vlm):
    path, model, processor, renderer = vlm
    engine = TransformersEngine.create(ModelSource(path=path, module=model, tokenizer=processor.tokenizer), {"device": "cpu"})
    try:
        a, b, c = image(renderer, 1), image(renderer, 2), image(renderer, 5, (90, 30))
        same = prompt(renderer, "What is shown?", [a])
        assert same == prompt(renderer, "What is shown?", [b])
        cases = [(same, [a]), (same, [b]), (prompt(renderer, "Compare them.", [a, c]), [a, c]),
                 (prompt(renderer, "No image here.", []), [])]
        gens = await asyncio.gather(*(engine.generate(ids, GREEDY, images=imgs) for ids, imgs in cases))
        assert engine.stats.prefill_tokens_saved == 0  # one token list, two images: never shared
        for (ids, imgs), [gen] in zip(cases, gens):
            tokens, logprobs = reference(model, processor, ids, imgs, len(gen.token_ids))
            assert gen.token_ids == tokens
            assert np.allclose(gen.logprobs, logprobs, atol=1e-4)
    finally:
        await engine.close()


async def test_a_new_turn_with_an_image_extends_the_kept_kv(vlm):
    path, model, processor, renderer = vlm
    engine = TransformersEngine.create(ModelSource(path=path, module=model, tokenizer=processor.tokenizer), {"device": "cpu"})
    try:
        a, b = image(renderer, 3), image(renderer, 4, (40, 80))
        first = prompt(renderer, "Zoom in.", [a])
        [gen] = await engine.generate(first, GREEDY, session_id="t", images=[a])
        tool = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "zoomed"}]}
        second = first + gen.token_ids + renderer.tool_delta([tool], [b.grid_thw])
        [gen2] = await engine.generate(second, GREEDY, session_id="t", images=[a, b])
        assert engine.stats.reused_tokens > len(first) - 1
        tokens, logprobs = reference(model, processor, second, [a, b], len(gen2.token_ids))
        assert gen2.token_ids == tokens and np.allclose(gen2.logprobs, logprobs, atol=1e-4)
    finally:
        await engine.close()


async def test_a_text_model_refuses_images(tiny_qwen3_path, qwen3_tokenizer):
    engine = TransformersEngine.create(ModelSource(path=tiny_qwen3_path, tokenizer=qwen3_tokenizer), {"device": "cpu"})
    try:
        with pytest.raises(ValueError, match="not a vision-language model"):
            await engine.generate([1, 2, 3], GREEDY, images=[TrajectoryImage(png=b"x", grid_thw=(1, 2, 2))])
    finally:
        await engine.close()


async def test_engine_logprobs_agree_with_the_trainers(vlm):
    """Trajectories sampled by the engine (a figure in the prompt) score the same under the trainer's
    packed forward with images: <= 1e-3 per model token."""
    from toolrl.config import RewardConfig, RolloutConfig
    from toolrl.parsers.hermes import HermesParser
    from toolrl.rollout import RolloutContext, Route, run_rollouts
    from toolrl.schemas import Sample
    from toolrl.training.packing import build_batch
    from toolrl.training.step import response_logprobs

    path, model, processor, renderer = vlm
    engine = TransformersEngine.create(ModelSource(path=path, module=model, tokenizer=processor.tokenizer), {"device": "cpu"})
    ctx = RolloutContext(engine=engine, renderer_factory=lambda schemas: renderer,
                         config=RolloutConfig(max_new_tokens=10, max_response_tokens=10),
                         routes={None: Route({}, 2, HermesParser(), [], RewardConfig())})
    samples = [Sample(prompt=[{"role": "user", "content": "<image>Find x."}], images=[png(60, 40, 7)], index=0),
               Sample(prompt=[{"role": "user", "content": "Compare <image> and <image>."}],
                      images=[png(30, 50, 8), png(70, 30, 9)], index=1)]
    try:
        trajs = await run_rollouts(ctx, samples, 2, seed=0)
    finally:
        await engine.close()
    assert [len(t.images) for t in trajs] == [1, 1, 2, 2] and all(t.error is None for t in trajs)
    with torch.no_grad():
        got = response_logprobs(model, build_batch(trajs, [0.0] * len(trajs), processor=processor))
    for i, t in enumerate(trajs):
        mask = torch.tensor(t.response_mask, dtype=torch.bool)
        diff = (got[i, :len(t.response_ids)][mask] - torch.tensor(t.logprobs)[mask]).abs().max()
        assert diff <= 1e-3, (t.trajectory_id, float(diff))
