"""Trainer memory with images: ``train_step`` on the tiny Qwen2.5-VL (packed rows, the vision tower once
per micro-batch, chunked LM-head log-probs) against the full-logits computation, the anchor.

One GRPO update (forward, backward, clipping, a stateless SGD step) on ``toolrl.model_sources.tiny_qwen2_5_vl``
(hidden 64, 152k vocabulary, fp32, vision tower trained), two sequences in one micro-batch, each a
prompt with a figure (16 image tokens), then ``--response`` trained tokens. The anchor runs the
model's own forward per sequence (``model(input_ids, pixel_values, image_grid_thw, mm_token_type_ids)``:
no padding) and keeps the fp32 logits of every position for backward. Each variant runs in a fresh
subprocess, so its peak RSS is its own; ``step MB`` is that peak minus the RSS just before the step.
Each child runs the step twice and reports the second.

    OMP_NUM_THREADS=1 python benchmarks/vision_trainer_memory.py [--response 1024]

The last line reads ``peak memory new/full: X.XX`` (step memory).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import resource
import time
from typing import Any

from _common import machine, run_child, single_thread, table

single_thread()


def figure(seed: int) -> Any:
    from PIL import Image

    img = Image.new("RGB", (112, 112))
    img.putdata([((x * 7 + seed) % 256, (y * 5 + seed) % 256, (x * y) % 256) for y in range(112) for x in range(112)])
    return img


def trajectories(processor: Any, response: int) -> list[Any]:
    from toolrl.trajectory import Trajectory, TrajectoryImage

    rng = random.Random(0)
    out = []
    for i in range(2):
        img = figure(i)
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find x."}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        rendered = processor(text=[text], images=[img], return_tensors="pt")
        grid = tuple(rendered["image_grid_thw"][0].tolist())
        ids = [rng.randrange(100, 150_000) for _ in range(response)]
        out.append(Trajectory(trajectory_id=str(i), sample_index=0, group=0,
                              prompt_ids=rendered["input_ids"][0].tolist(),
                              images=[TrajectoryImage(png=buf.getvalue(), grid_thw=grid)], response_ids=ids,
                              response_mask=[1] * response, logprobs=[0.0] * response, reward=float(i)))
    return out


def anchor_step(model: Any, optimizer: Any, processor: Any, trajs: list[Any], algo: Any) -> None:
    """Full logits per sequence through the model's own forward, then the same loss."""
    from types import SimpleNamespace

    import torch
    from PIL import Image
    from toolrl.training.step import group_advantages, policy_loss

    adv = group_advantages([t.reward for t in trajs], [t.group for t in trajs])
    norm = {"tokens": float(sum(len(t.response_ids) for t in trajs)), "seqs": float(len(trajs)),
            "max_len": float(max(len(t.response_ids) for t in trajs))}
    optimizer.zero_grad(set_to_none=True)
    for t, a in zip(trajs, adv, strict=True):
        ids = torch.tensor([t.prompt_ids + t.response_ids])
        pixels = processor.image_processor(images=[Image.open(io.BytesIO(i.png)) for i in t.images],
                                           return_tensors="pt")
        logits = model(input_ids=ids, pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"],
                       mm_token_type_ids=(ids == processor.image_token_id).int(), use_cache=False).logits[0].float()
        p = len(t.prompt_ids)
        resp = logits[p - 1:p - 1 + len(t.response_ids)]
        targets = torch.tensor(t.response_ids)
        lp = (resp.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(resp, -1))[None]
        mask = torch.ones_like(lp)
        batch = SimpleNamespace(response_mask=mask, advantages=torch.tensor([a]), engine_logprobs=torch.zeros_like(lp))
        loss, _ = policy_loss(lp, lp.detach(), batch, algo, norm)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def child(variant: str, response: int) -> None:
    import torch
    from toolrl.config import AlgorithmConfig, OptimConfig
    from toolrl.model_sources import load_model, load_processor, tiny_qwen2_5_vl
    from toolrl.training.peakmem import rss_bytes
    from toolrl.training.step import StepOptions, train_step

    single_thread()
    path = tiny_qwen2_5_vl()
    model, processor = load_model(path).train(), load_processor(path)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-12)
    trajs = trajectories(processor, response)
    algo = AlgorithmConfig()
    options = StepOptions(algo, OptimConfig(micro_batch_size=2), pad_id=0, temperature=1.0,
                          max_response_tokens=response, processor=processor)
    before = (rss_bytes() or 0) / 2**20
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        if variant == "full":
            anchor_step(model, optimizer, processor, trajs, algo)
        else:
            train_step(model, optimizer, trajs, options)
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
    images = sum((t.prompt_ids + t.response_ids).count(processor.image_token_id) for t in trajs)
    print(json.dumps({"peak_mb": peak, "before_mb": before, "step_s": times[-1], "tokens": tokens,
                      "image_tokens": images}))


def run_variant(variant: str, response: int) -> dict[str, Any]:
    return run_child(__file__, ["--child", variant, "--response", str(response)], variant)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--response", type=int, default=1024, help="trained response tokens per sequence")
    parser.add_argument("--child", choices=["new", "full"])
    args = parser.parse_args()
    if args.child:
        child(args.child, args.response)
        return
    print(machine())
    got = {v: run_variant(v, args.response) for v in ("new", "full")}
    rows = [[v, got[v]["tokens"], got[v]["image_tokens"], got[v]["peak_mb"], got[v]["peak_mb"] - got[v]["before_mb"],
             got[v]["step_s"]] for v in ("full", "new")]
    print(f"tiny Qwen2.5-VL (hidden 64, vocab 151936), fp32, 2 sequences × {args.response} trained tokens, "
          "one figure each")
    print(table(["variant", "tokens", "image tokens", "peak RSS MB", "step MB", "step s"], rows))
    new, full = got["new"], got["full"]
    print(f"peak memory new/full: {(new['peak_mb'] - new['before_mb']) / (full['peak_mb'] - full['before_mb']):.2f}")


if __name__ == "__main__":
    main()
