"""GRPO step time: toolrl against TRL 1.16 ``GRPOTrainer``, side by side in one process.

Both frameworks get the same tiny random Qwen3 (``toolrl.model_sources.tiny_qwen3``, same weights), the
real Qwen3 tokenizer and chat template, the same arithmetic prompts in the same order (no
shuffling), the same reward (1 for the exact answer + 0.1 · the fraction of digits in the
response), the same calculator (the ``toolrl-plugin-calculator`` evaluator; its schema in every
prompt), 2 prompts × 4 completions per step, at most 64 completion tokens (tool output included),
temperature 1, no KL term (beta 0), AdamW at the same learning rate, grad clipping 1.0, fp32, one
CPU thread. Logging, saving and progress bars are off in both. Gradient checkpointing is off in
both (TRL turns it on by default; toolrl does not). The prompts are checked to be token-identical.

toolrl's step is what ``toolrl train`` does per step (``toolrl.processes.in_process.build_local_run`` builds the parts
from a config; ``run_rollouts``, then the trainer role's step and weight sync), minus writing
traces and checkpoints. TRL's step is one ``GRPOTrainer`` optimisation step (generation, tool
loop, rewards, loss, backward, optimizer). The steps alternate — TRL step, toolrl step, TRL step…
(toolrl's runs in TRL's ``on_step_end`` callback, outside TRL's timing) — so load from other
processes on the machine hits both alike. The first step of each is a warm-up and is not counted.

A random model never writes a tool call, in either framework. By default the step is compared
as-is: the calculator schema in every prompt (282 tokens), 64 sampled tokens per response, no
calls. ``--prime K`` first teaches the model the call format with K SFT steps (cached on disk) so
that both tool loops run; the per-step tool-call rate of each framework is printed.

    OMP_NUM_THREADS=1 python benchmarks/grpo_vs_trl.py [--steps N] [--prime 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from typing import Any

from _common import machine, median, single_thread, table

single_thread()

import torch  # noqa: E402

single_thread()

BATCH_PROMPTS, GROUP, MAX_COMPLETION, LR, SEED = 2, 4, 64, 1e-5, 0
_INT = re.compile(r"-?\d+")


def cpu_since(start: os.times_result) -> dict[str, float]:
    """Process CPU seconds (all threads) since ``start``: total and the kernel's share."""
    now = os.times()
    return {"cpu_s": (now.user - start.user) + (now.system - start.system), "sys_s": now.system - start.system}


def reward(text: str, ground_truth: str) -> float:
    """1 if the last integer in the response is the answer, plus 0.1 · the share of digits in it."""
    numbers = _INT.findall(text.replace(",", ""))
    exact = 1.0 if numbers and numbers[-1] == str(ground_truth).strip() else 0.0
    return exact + 0.1 * (sum(c.isdigit() for c in text) / len(text) if text else 0.0)


def toolrl_config(steps: int, model_dir: str, tool_schema: dict[str, Any]) -> Any:
    from toolrl.config import load_config

    return load_config(None, data={
        "model": {"source": model_dir},
        "env": "arithmetic", "env_options": {"train_size": 64, "seed": SEED},
        "data": {"batch_size": BATCH_PROMPTS, "shuffle": False},
        "engine": {"name": "transformers", "max_batch_size": 32},
        "rollout": {"n": GROUP, "temperature": 1.0, "max_turns": 8, "max_new_tokens": MAX_COMPLETION,
                    "max_response_tokens": MAX_COMPLETION, "parser": "hermes"},
        "tools": {"entries": [{"class_name": "calculator", "config": {"type": "native", "timeout": 5},
                               "tool_schema": tool_schema}]},
        "algorithm": {"loss_agg": "token-mean", "loss_options": {"kl_coef": 0.0}},
        "optim": {"lr": LR, "grad_clip": 1.0, "micro_batch_size": BATCH_PROMPTS * GROUP},
        "trainer": {"total_steps": steps, "seed": SEED, "progress": False, "plot": False},
    })


class ToolrlRunner:
    """One toolrl training step at a time, on a persistent event loop (as in ``train_async``)."""

    def __init__(self, steps: int, model_dir: str, tool_schema: dict[str, Any]) -> None:
        from toolrl.processes.in_process import build_local_run
        from toolrl.processes.trainer_group import LocalTrainer
        from toolrl.processes.trainer_rank import TrainerRank

        self.loop = asyncio.new_event_loop()
        self.config = toolrl_config(steps, model_dir, tool_schema)
        self.run = self.loop.run_until_complete(build_local_run(self.config))
        self.run.ctx.routes[None].reward_functions = [("exact+digits", 1.0, lambda text, gt, **_: reward(text, gt))]
        # The trainer role as `toolrl train` runs it without Ray: one rank sharing the engine's module.
        self.trainer = LocalTrainer(TrainerRank(self.config))
        self.trainer.rank.setup(model=self.run.model, tokenizer=self.run.tokenizer)
        self.step_index = 0
        self.records: list[dict[str, float]] = []

    async def _step(self) -> dict[str, float]:
        from toolrl.processes import sync_weights
        from toolrl.processes.controller import batch_for_step
        from toolrl.rollout import run_rollouts
        from toolrl.seeds import step_seed

        cfg, run, step = self.config, self.run, self.step_index
        c0, t0 = os.times(), time.perf_counter()
        prompts = batch_for_step(run.samples, step, cfg.data.batch_size, cfg.trainer.seed, cfg.data.shuffle)
        run.model.eval()
        trajs = await run_rollouts(run.ctx, prompts, cfg.rollout.n, seed=step_seed(cfg.rollout.seed, step),
                                   id_prefix=f"t{step + 1}-")
        t1 = time.perf_counter()
        await self.trainer.step(trajs, step + 1)
        await sync_weights(self.trainer, self.run.rollouts, step + 1)
        t2 = time.perf_counter()
        return {"step_s": t2 - t0, "generate_s": t1 - t0, "train_s": t2 - t1, **cpu_since(c0),
                "calls": sum(len(t.tool_results) for t in trajs) / len(trajs),
                # Model tokens only (tool results excluded), as TRL's completions/mean_length counts them.
                "completion_len": sum(sum(t.response_mask) for t in trajs) / len(trajs),
                "prompt_len": sum(len(t.prompt_ids) for t in trajs) / len(trajs)}

    def step(self) -> None:
        self.records.append(self.loop.run_until_complete(self._step()))
        self.step_index += 1

    def close(self) -> None:
        self.loop.run_until_complete(self.run.rollouts.close())
        self.loop.close()


def primed_model(base_dir: str, steps: int, tool_schema: dict[str, Any], lr: float = 5e-3) -> str:
    """The tiny model after a short SFT on calculator conversations (call, then ``The answer is N.``),
    so that both frameworks run their tool loops. Built once and cached next to the base model.

    The SFT sequences are what toolrl's rollout would produce (prompt, model tokens, the chat
    template's tool-result delta, model tokens); TRL's tool loop appends the same template delta.
    The loss is cross-entropy on the model tokens, computed with ``toolrl.training.step.response_logprobs``."""
    import hashlib
    import json
    import shutil
    from pathlib import Path

    from toolrl.config import load_config
    from toolrl.data.sources import load_samples
    from toolrl.model_sources import load_model, load_tokenizer
    from toolrl.renderers.chat import ChatRenderer
    from toolrl.training.step import build_batch, response_logprobs
    from toolrl.trajectory import Trajectory
    from toolrl_calculator.evaluate import evaluate, format_number

    key = hashlib.sha256(json.dumps([tool_schema, steps, lr], sort_keys=True).encode()).hexdigest()[:10]
    final = Path(base_dir).with_name(f"{Path(base_dir).name}-toolprimed-{key}")
    if (final / "model.safetensors").exists():
        return str(final)
    print(f"priming the model for tool calls ({steps} SFT steps, cached in {final}) ...", flush=True)
    t0 = time.perf_counter()
    tokenizer, model = load_tokenizer(base_dir), load_model(base_dir)
    renderer = ChatRenderer(tokenizer, [tool_schema])
    examples = []
    primer = load_config(None, data={"env": "arithmetic", "env_options": {"train_size": 256, "seed": SEED + 1}})
    for s in load_samples(primer):  # not the benchmark's prompts
        expression = s.prompt[0].content.split("What is ", 1)[1].split("?", 1)[0]
        call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
        first = renderer.text_ids(f"<tool_call>\n{call}\n</tool_call>") + [renderer.eos_id]
        delta = renderer.tool_delta([renderer.tool_message(format_number(evaluate(expression)), "calculator")])
        second = renderer.text_ids(f"The answer is {s.ground_truth}.") + [renderer.eos_id]
        examples.append(Trajectory(
            trajectory_id=str(s.index), sample_index=s.index or 0, group=0,
            prompt_ids=renderer.prompt_ids([m.to_template() for m in s.prompt]), response_ids=first + delta + second,
            response_mask=[1] * len(first) + [0] * len(delta) + [1] * len(second),
            logprobs=[0.0] * (len(first) + len(delta) + len(second))))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    size = BATCH_PROMPTS * GROUP
    for step in range(steps):
        chunk = [examples[(step * size + i) % len(examples)] for i in range(size)]
        batch = build_batch(chunk, [0.0] * size)
        loss = -(response_logprobs(model, batch) * batch.response_mask).sum() / batch.response_mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    tmp = final.with_name(f".{final.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    try:
        os.rename(tmp, final)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"primed in {time.perf_counter() - t0:.0f} s (final SFT loss {float(loss):.3f})")
    return str(final)


def calculator_function() -> Any:
    """The calculator as TRL wants a tool: a typed function whose docstring becomes its schema (with
    the toolrl tool's descriptions). toolrl's calculator is given the very schema TRL derives from
    it, so both frameworks render token-identical prompts (checked)."""
    from toolrl_calculator.evaluate import CalculatorError, evaluate, format_number
    from toolrl_calculator.tool import CalculatorTool

    spec = CalculatorTool.schema["function"]

    def calculator(expression: str) -> str:
        try:
            return format_number(evaluate(expression))
        except CalculatorError as exc:
            return f"Error in 'expression': {exc}"

    calculator.__doc__ = (f"{spec['description']}\n\nArgs:\n    expression: "
                          f"{spec['parameters']['properties']['expression']['description']}\n")
    return calculator


def trl_trainer(model_dir: str, steps: int, out_dir: str, callback: Any) -> Any:
    from datasets import Dataset
    from toolrl.data.sources import load_samples
    from toolrl.model_sources import load_model, load_tokenizer
    from trl import GRPOConfig, GRPOTrainer

    samples = load_samples(toolrl_config(1, model_dir, {}))  # the prompts toolrl trains on, in order
    dataset = Dataset.from_list([{"prompt": [m.to_template() for m in s.prompt], "answer": s.ground_truth}
                                 for s in samples])

    def trl_reward(completions: list[list[dict[str, Any]]], answer: list[str], **_: Any) -> list[float]:
        texts = [next((m.get("content") or "" for m in reversed(c) if m["role"] == "assistant"), "")
                 for c in completions]
        return [reward(t, a) for t, a in zip(texts, answer)]

    args = GRPOConfig(
        output_dir=out_dir, use_cpu=True, report_to=[], seed=SEED, bf16=False,
        per_device_train_batch_size=BATCH_PROMPTS * GROUP, num_generations=GROUP, gradient_accumulation_steps=1,
        max_completion_length=MAX_COMPLETION, temperature=1.0, beta=0.0, learning_rate=LR, max_grad_norm=1.0,
        lr_scheduler_type="constant", warmup_steps=0, max_steps=steps, shuffle_dataset=False,
        logging_strategy="no", save_strategy="no", eval_strategy="no", disable_tqdm=True, log_completions=False,
        dataloader_num_workers=0,
        # TRL turns gradient checkpointing on by default; toolrl does not. Off here, as for toolrl.
        gradient_checkpointing=False,
    )
    return GRPOTrainer(model=load_model(model_dir), reward_funcs=trl_reward, args=args, train_dataset=dataset,
                       processing_class=load_tokenizer(model_dir), tools=[calculator_function()],
                       callbacks=[callback])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5, help="timed steps per framework (after one warm-up step)")
    ap.add_argument("--prime", type=int, default=0, metavar="SFT_STEPS",
                    help="first prime the model for tool calls with this many SFT steps (cached; ~100 is enough)")
    args = ap.parse_args(argv)
    total = args.steps + 1
    warnings.filterwarnings("ignore")
    from transformers import PrinterCallback, TrainerCallback
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    print(f"machine: {machine()} · torch threads {torch.get_num_threads()}")

    from toolrl.model_sources import tiny_qwen3
    from transformers.utils import get_json_schema

    tool_schema = get_json_schema(calculator_function())
    model_dir = tiny_qwen3()
    if args.prime:
        model_dir = primed_model(model_dir, args.prime, tool_schema)
    t_import = time.perf_counter()
    toolrl = ToolrlRunner(total, model_dir, tool_schema)
    print(f"toolrl composed in {time.perf_counter() - t_import:.1f} s; model {toolrl.run.path} "
          f"({sum(p.numel() for p in toolrl.run.model.parameters()) / 1e6:.2f} M params)")

    class Interleave(TrainerCallback):
        """Times TRL's steps end to end and runs one toolrl step after each, outside TRL's timing."""

        def __init__(self) -> None:
            self.trl_steps: list[float] = []
            self.trl_cpu: list[dict[str, float]] = []
            self.mark, self.cpu_mark = 0.0, os.times()

        def on_train_begin(self, *a: Any, **k: Any) -> None:
            self.mark, self.cpu_mark = time.perf_counter(), os.times()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            self.trl_steps.append(time.perf_counter() - self.mark)
            self.trl_cpu.append(cpu_since(self.cpu_mark))
            toolrl.step()
            single_thread()  # nothing may have changed it, but make sure both keep one thread
            self.mark, self.cpu_mark = time.perf_counter(), os.times()

    interleave = Interleave()
    with tempfile.TemporaryDirectory(prefix="grpo_vs_trl_") as out:
        t = time.perf_counter()
        trainer = trl_trainer(toolrl.run.path, total, out, interleave)
        trainer.remove_callback(PrinterCallback)  # it prints the final metrics dict
        print(f"TRL GRPOTrainer built in {time.perf_counter() - t:.1f} s")
        trl_generate: list[dict[str, float]] = []
        inner = trainer._generate_and_score_completions

        def timed_generate(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            out = inner(*a, **k)
            metrics = trainer._metrics["train"]  # appended to by the call above, cleared only when logging
            trl_generate.append({"generate_s": time.perf_counter() - t0,
                                 "calls": metrics["tools/call_frequency"][-1],
                                 "completion_len": metrics["completions/mean_length"][-1]})
            return out

        trainer._generate_and_score_completions = timed_generate
        prompt = trainer.train_dataset[0]["prompt"]
        trl_prompt = list(trainer.processing_class.apply_chat_template(
            prompt, tools=trainer.tools, add_generation_prompt=True, tokenize=True, return_dict=False))
        ctx = toolrl.run.ctx
        same_prompt = trl_prompt == ctx.renderer(ctx.routes[None]).prompt_ids(prompt)
        trainer.train()
    toolrl.close()

    tr, tt, tc, tg = toolrl.records[1:], interleave.trl_steps[1:], interleave.trl_cpu[1:], trl_generate[1:]
    trl_gen = [g["generate_s"] for g in tg]
    rows = [[i + 1, t["step_s"], t["cpu_s"], t["generate_s"], t["train_s"], t["calls"], t["completion_len"],
             s, c["cpu_s"], g["generate_s"], s - g["generate_s"], g["calls"], g["completion_len"]]
            for i, (t, s, c, g) in enumerate(zip(tr, tt, tc, tg))]
    print("\nper step (wall s unless marked cpu; 'gen' is rollout/generation incl. tools and rewards)")
    print(table(["step", "toolrl", "cpu", "gen", "train", "calls/resp", "model tok",
                 "TRL", "cpu", "gen", "train", "calls/resp", "model tok"], rows))
    ours, theirs = median([t["step_s"] for t in tr]), median(tt)
    print(f"\nmodel: {model_dir}\nprompt tokens: toolrl {tr[0]['prompt_len']:.0f}, TRL {len(trl_prompt)} "
          f"(token-identical: {same_prompt}); warm-up step: toolrl {toolrl.records[0]['step_s']:.2f} s, "
          f"TRL {interleave.trl_steps[0]:.2f} s")
    ours_cpu, theirs_cpu = median([t["cpu_s"] for t in tr]), median([c["cpu_s"] for c in tc])
    print(table(["framework", "median s/step", "cpu s/step", "of which sys", "gen s", "train s", "steps"], [
        ["toolrl", ours, ours_cpu, median([t["sys_s"] for t in tr]), median([t["generate_s"] for t in tr]),
         median([t["train_s"] for t in tr]), len(tr)],
        ["TRL 1.16 GRPOTrainer", theirs, theirs_cpu, median([c["sys_s"] for c in tc]), median(trl_gen),
         median([s - g for s, g in zip(tt, trl_gen)]), len(tt)],
    ]))
    ratio = ours / theirs
    print(f"\ntoolrl / TRL step time = {ratio:.3f} wall, {ours_cpu / theirs_cpu:.3f} cpu  (goal <= 0.5: "
          f"{'met' if ratio <= 0.5 else 'MISSED'}; TRL's anchor on these machines: 14.6 s/step, tool-primed model)")
    return 0

if __name__ == "__main__":
    sys.exit(main())
