"""Prefix-shared (tree) training against today's packing: one GRPO trainer step
(``toolrl.training.step.train_step``: forward, backward, clipping, a stateless SGD step) with
``optim.share_prefixes`` on and off, side by side.

Tiny Qwen3 (``toolrl.model_sources.tiny_qwen3``: hidden 64, 2 layers, 152k vocabulary, fp32), groups of 8
samples, one micro-batch per group, every assistant token trained, two workloads:

- group: a 2,048-token prompt, responses of 64–256 tokens (evenly spread over the 8 samples);
- tau2-like: a 2,048-token prompt and 4 turns, each an assistant message of 24–64 tokens (trained)
  and a tool result of 48–128 tokens (not trained); half the samples make the same first call and
  get the same result (a common first turn), the others diverge from the first generated token;
- geo3k (``--images``, instead of the two above and the engine): the tiny Qwen2.5-VL
  (``toolrl.model_sources.tiny_qwen2_5_vl``), a prompt with a 112×112 figure (16 image tokens: the tiny
  model's processor caps images at 12,544 pixels) and the ``--prompt`` text tokens; each sample a
  call of 24–64 tokens (trained), a tool result holding a 112×112 crop of its own (16 image tokens,
  not trained) and an answer of 64–256 tokens (trained); the vision tower trains. Last line
  ``geo3k trainer step shared/unshared: X.XX``.

Each variant runs in a fresh subprocess (``--child``): ``step s`` is the median of ``--repeats``
steps after one warm-up step; ``step MB`` the step's peak RSS (``trainer_peak_mb``) minus the RSS
just before it; ``computed``/``total`` the tokens the model ran on and those the unshared packing
runs on; ``cpu s`` the step's process CPU time (the same figure on a quiet machine, steadier on a busy
one). The last line reads ``trainer step shared/unshared: X.XX`` (group workload, median step
seconds).

    OMP_NUM_THREADS=1 python benchmarks/prefix_sharing.py [--groups 1] [--repeats 3] [--quick] [--images]

On a GPU: ``--device cuda`` (bf16 weights there; ``step MB`` is then the CUDA peak above the memory
allocated before the step) and ``--shape 0.6b`` (Qwen3-0.6B's shape — hidden 1024, 28 layers, 16/8
heads — random weights) for a model whose layers, not its LM head, are most of the work. On a CPU,
``--shape body`` (hidden 128, 8 layers, MLPs of 4,096) is such a model at a size one core can step.
``--attention eager``: the model's eager attention (gpt-oss's kind), which takes the tree as one dense
mask over the row; its scores are quadratic in the row, so pair it with ``--quick`` on a CPU.
``--attention spans`` / ``one-call``: sdpa with the packed row's attention as one call per span, or one
call per layer (``modeling.packed_attention``: FlexAttention on CUDA, a dense mask on CPU), whatever
the device's default (``sdpa``: one call on CUDA, spans on CPU).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from _common import machine, run_child, single_thread, table

single_thread()

GROUP = 8
# model.tiny overrides: Qwen3-0.6B's shape (its vocabulary is tiny-qwen3's already).
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {},
    "0.6b": {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 128, "intermediate_size": 3072},
    # For a CPU: layers that outweigh the 152k-vocabulary head (8 layers, wide MLPs) at a size one core
    # trains in seconds, to show where the step ratio goes once the head is no longer most of the work.
    "body": {"hidden_size": 128, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 32, "intermediate_size": 4096},
}


def group_workload(groups: int, prompt: int) -> list[Any]:
    from toolrl.trajectory import Trajectory

    rng = random.Random(0)
    out = []
    for g in range(groups):
        p = [rng.randrange(100, 150_000) for _ in range(prompt)]
        for s in range(GROUP):
            n = 64 + (256 - 64) * s // (GROUP - 1)
            out.append(Trajectory(trajectory_id=f"{g}-{s}", sample_index=s, group=g, prompt_ids=p,
                                  response_ids=[rng.randrange(100, 150_000) for _ in range(n)],
                                  response_mask=[1] * n, logprobs=[-1.0] * n, reward=float(s % 2)))
    return out


def tau2_workload(groups: int, prompt: int) -> list[Any]:
    from toolrl.trajectory import Trajectory

    rng = random.Random(1)

    def tokens(lo: int, hi: int) -> list[int]:
        return [rng.randrange(100, 150_000) for _ in range(rng.randint(lo, hi))]

    out = []
    for g in range(groups):
        p = tokens(prompt, prompt)
        first = (tokens(24, 64), tokens(48, 128))
        for s in range(GROUP):
            ids: list[int] = []
            mask: list[int] = []
            for turn in range(4):
                call, result = first if turn == 0 and s < GROUP // 2 else (tokens(24, 64), tokens(48, 128))
                ids += call + result
                mask += [1] * len(call) + [0] * len(result)
            out.append(Trajectory(trajectory_id=f"{g}-{s}", sample_index=s, group=g, prompt_ids=p,
                                  response_ids=ids, response_mask=mask, logprobs=[-1.0] * len(ids),
                                  reward=float(s % 2)))
    return out


def picture(size: int, seed: int) -> Any:
    from PIL import Image

    img = Image.new("RGB", (size, size))
    img.putdata([((x * 7 + seed * 31) % 256, (y * 5 + seed) % 256, (x * y + seed) % 256)
                 for y in range(size) for x in range(size)])
    return img


def geo3k_workload(groups: int, prompt: int, processor: Any) -> list[Any]:
    import io

    from toolrl.trajectory import Trajectory, TrajectoryImage

    def held(img: Any) -> tuple[list[int], TrajectoryImage]:
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        grid = tuple(processor.image_processor(images=[img], return_tensors="pt")["image_grid_thw"][0].tolist())
        pad = processor.image_token_id
        return [pad] * (grid[0] * grid[1] * grid[2] // 4), TrajectoryImage(png=buf.getvalue(), grid_thw=grid)

    rng = random.Random(3)
    start, end = (processor.tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>"))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find x."}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def tokens(lo: int, hi: int) -> list[int]:
        return [rng.randrange(100, 150_000) for _ in range(rng.randint(lo, hi))]

    out = []
    for g in range(groups):
        fig = picture(112, g)
        rendered = processor(text=[text], images=[fig], return_tensors="pt")
        p = rendered["input_ids"][0].tolist() + tokens(prompt, prompt)
        shown = held(fig)[1]
        for s in range(GROUP):
            run, crop = held(picture(112, 100 * g + s + 1))
            call, result, answer = tokens(24, 64), [start, *run, end], tokens(64, 256)
            ids = call + result + answer
            out.append(Trajectory(trajectory_id=f"{g}-{s}", sample_index=s, group=g, prompt_ids=p,
                                  images=[shown, crop], response_ids=ids,
                                  response_mask=[1] * len(call) + [0] * len(result) + [1] * len(answer),
                                  logprobs=[-1.0] * len(ids), reward=float(s % 2)))
    return out


def child(workload: str, share: bool, args: argparse.Namespace) -> None:
    import torch
    from toolrl.config import AlgorithmConfig, OptimConfig
    from toolrl.model_sources import load_model, load_processor, tiny_qwen2_5_vl, tiny_qwen3
    from toolrl.training import packing
    from toolrl.training.packing import build_batch
    from toolrl.training.peakmem import rss_bytes
    from toolrl.training.step import StepOptions, train_step

    single_thread()
    torch.manual_seed(0)
    cuda = args.device == "cuda"
    dtype = "bfloat16" if cuda else "float32"
    processor = None
    if workload == "geo3k":
        path = tiny_qwen2_5_vl()
        model, processor = load_model(path, dtype=dtype, device=args.device), load_processor(path)
        trajs = geo3k_workload(args.groups, args.prompt, processor)
    else:
        model = load_model(tiny_qwen3(**SHAPES[args.shape]), dtype=dtype, device=args.device)
        model.config._attn_implementation = "eager" if args.attention == "eager" else "sdpa"
        if args.attention in ("spans", "one-call"):
            packing.one_call_attention = lambda device: args.attention == "one-call"
        trajs = (group_workload if workload == "group" else tau2_workload)(args.groups, args.prompt)
    optim = OptimConfig(micro_batch_size=GROUP, share_prefixes=share)
    options = StepOptions(AlgorithmConfig(), optim, pad_id=0, temperature=1.0,
                          max_response_tokens=max(len(t.response_ids) for t in trajs), processor=processor)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    batches = [build_batch(trajs[a:a + GROUP], [0.0] * GROUP, share_prefixes=share, processor=processor)
               for a in range(0, len(trajs), GROUP)]
    times, cpu, step_mb = [], [], []
    for _ in range(args.repeats + 1):
        before = (torch.cuda.memory_allocated() if cuda else rss_bytes()) / 2**20
        t0, c0 = time.perf_counter(), time.process_time()
        metrics = train_step(model, optimizer, trajs, options)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        step_mb.append(metrics.get("trainer_peak_mb", float("nan")) - before)
    print(json.dumps({"step_s": statistics.median(times[1:]), "cpu_s": statistics.median(cpu[1:]),
                      "step_mb": max(step_mb[1:]),
                      "computed": sum(b.tokens for b in batches), "total": sum(b.total_tokens for b in batches)}))


def engine_child(share: bool, args: argparse.Namespace) -> None:
    """A group's 8 trajectories as the agent loop sends them: 8 requests with one prompt, each its own
    session and seed, one new token each (the group's prefill and first sample); seconds until all
    are done."""
    import asyncio

    from toolrl.engines import ModelSource, SamplingParams
    from toolrl.engines.transformers import TransformersEngine
    from toolrl.model_sources import load_model, load_tokenizer, tiny_qwen3

    single_thread()
    path = tiny_qwen3(**SHAPES[args.shape])
    prompt, repeats = args.prompt, args.repeats
    rng = random.Random(2)

    async def group(engine: Any, run: int) -> float:
        ids = [rng.randrange(100, 150_000) for _ in range(prompt)]
        t0 = time.perf_counter()
        await asyncio.gather(*(engine.generate(ids, SamplingParams(max_new_tokens=1, seed=s),
                                               session_id=f"{run}-{s}") for s in range(GROUP)))
        return time.perf_counter() - t0

    async def main() -> list[float]:
        dtype = "bfloat16" if args.device == "cuda" else "float32"
        module = load_model(path, dtype=dtype, device=args.device)
        engine = TransformersEngine.create(ModelSource(path=path, module=module, tokenizer=load_tokenizer(path)),
                                           {"device": args.device, "share_prompts": share})
        times = [await group(engine, run) for run in range(repeats + 1)]
        await engine.close()
        return times, engine.stats

    times, stats = asyncio.run(main())
    print(json.dumps({"group_s": statistics.median(times[1:]), "prefilled": stats.prefilled_tokens,
                      "saved": stats.prefill_tokens_saved}))


def run_workload(workload: str, share: bool, args: argparse.Namespace) -> dict[str, Any]:
    return run_child(__file__, ["--child", workload, "--share", str(int(share)), "--groups", str(args.groups),
                                "--prompt", str(args.prompt), "--repeats", str(args.repeats), "--device", args.device,
                                "--shape", args.shape, "--attention", args.attention], f"{workload} share={share}")


def images(args: argparse.Namespace) -> None:
    print(f"device {args.device}, tiny Qwen2.5-VL, geo3k workload")
    res = {share: run_workload("geo3k", share, args) for share in (False, True)}
    print(table(["workload", "packing", "step s", "cpu s", "step MB", "computed", "total", "prefix_share"],
                [["geo3k", "shared" if share else "unshared", r["step_s"], r["cpu_s"], r["step_mb"], r["computed"],
                  r["total"], 1 - r["computed"] / r["total"]] for share, r in res.items()]))
    print(f"geo3k trainer step shared/unshared: {res[True]['step_s'] / res[False]['step_s']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a 512-token prompt, one timed step")
    parser.add_argument("--images", action="store_true", help="the geo3k workload on the tiny Qwen2.5-VL only")
    parser.add_argument("--child", choices=["group", "tau2", "geo3k", "engine"])
    parser.add_argument("--share", type=int, default=1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--attention", choices=["sdpa", "eager", "spans", "one-call"], default="sdpa",
                        help="the text model's attention (eager: the tree as one dense mask; spans / one-call: "
                        "sdpa with one call per span / per layer, whatever the device's default)")
    args = parser.parse_args()
    if args.quick:
        args.prompt, args.repeats = 512, 1
    if args.child == "engine":
        engine_child(bool(args.share), args)
        return
    if args.child:
        child(args.child, bool(args.share), args)
        return
    print(machine())
    if args.images:
        images(args)
        return
    print(f"device {args.device}, model shape {args.shape}, attention {args.attention}")
    rows, ratios, cpu = [], {}, {}
    for workload in ("group", "tau2"):
        res = {share: run_workload(workload, share, args) for share in (False, True)}
        for share in (False, True):
            r = res[share]
            rows.append([workload, "shared" if share else "unshared", r["step_s"], r["cpu_s"], r["step_mb"],
                         r["computed"], r["total"], 1 - r["computed"] / r["total"]])
        ratios[workload] = res[True]["step_s"] / res[False]["step_s"]
        cpu[workload] = res[True]["cpu_s"] / res[False]["cpu_s"]
    print(table(["workload", "packing", "step s", "cpu s", "step MB", "computed", "total", "prefix_share"], rows))
    engine = {share: run_workload("engine", share, args) for share in (False, True)}
    print(f"engine group of {GROUP}, {args.prompt}-token prompt, first token each: "
          f"{engine[False]['group_s']:.3f} s unshared, {engine[True]['group_s']:.3f} s shared "
          f"({engine[True]['saved']} prompt tokens not prefilled)")
    print(f"trainer step cpu shared/unshared: group {cpu['group']:.2f}, tau2-like {cpu['tau2']:.2f}")
    print(f"tau2-like trainer step shared/unshared: {ratios['tau2']:.2f}")
    print(f"engine group prefill shared/unshared: {engine[True]['group_s'] / engine[False]['group_s']:.2f}")
    print(f"trainer step shared/unshared: {ratios['group']:.2f}")


if __name__ == "__main__":
    main()
