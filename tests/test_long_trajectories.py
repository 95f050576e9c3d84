"""Issue 33: a `toolrl train` run on a τ²-like environment whose trajectories are past 16k tokens
completes on two CPU ranks with sequence parallelism (`trainer.world_size=2 trainer.sequence_parallel=2`,
ray.address=local). Each prompt is a long domain policy (numbered clauses) in the system message, the
calculator tool offered and one user question, as τ²-bench's airline/retail tasks are; the tiny random
Qwen3 (32,768 positions) may answer in several turns, calling the tool or not (its random 16 tokens
are one turn). Measured: 2-3 min on two shared cores, the train run ~100-135 s of it (per step: rollout
~7 s, training the two 16.5k-token rows ~23 s; the rest is Ray and model start-up)."""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from pathlib import Path

import pytest
from _dists import EVEN_TOKENS, make_dist, run_toolrl

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny.yaml")
ENV = {"OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}
CLAUSES = 455  # about 16.5k tokens with the chat template and the tool schema
LONG = 16_384  # every trajectory (prompt + response tokens) is longer than this
SUBJECTS = ["refund", "baggage", "seat change", "cancellation", "upgrade", "loyalty points", "rebooking", "meal"]
RULES = ["must verify the user's identity before", "may not offer compensation for", "shall confirm in writing",
         "needs the reservation number to process", "must transfer to a human agent for disputed",
         "can waive the fee once per year for", "must quote the total before charging for"]


def policy(clauses: int) -> str:
    """A deterministic domain policy of ``clauses`` numbered clauses (about 36 Qwen3 tokens each)."""
    rng = random.Random(0)
    lines = [f"{i}. The agent {rng.choice(RULES)} any {rng.choice(SUBJECTS)} request of more than "
             f"{rng.randrange(10, 999)} dollars within {rng.randrange(1, 90)} days (see clause {rng.randrange(1, i + 1)})."
             for i in range(1, clauses + 1)]
    return "# Airline agent policy\n" + "\n".join(lines)


def rows(clauses: int) -> list[dict]:
    out = []
    for index, (a, b) in enumerate([(417, 289), (1024, 376)]):
        answer = str(a + b)
        out.append({
            "data_source": "arithmetic",
            "prompt": [{"role": "system", "content": policy(clauses) + "\nUse the calculator, then answer as: "
                                                                     "The answer is N."},
                       {"role": "user", "content": f"My two refunds were {a} and {b} dollars. What is the total?"}],
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"index": index, "env": "arithmetic",
                           "tools_kwargs": {"calculator": {"create_kwargs": {"ground_truth": answer}}}},
        })
    return out


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow  # two 16.5k-token prompts rolled out and trained on two Ray ranks: 2-3 min
@pytest.mark.long
def test_a_train_run_with_trajectories_past_16k_tokens_on_two_sequence_parallel_ranks(tiny_qwen3_path, tmp_path):
    from toolrl.renderers.chat import ChatRenderer
    from toolrl_calculator.tool import CalculatorTool
    from transformers import AutoTokenizer

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tiny_qwen3_path), [CalculatorTool.schema])
    data = rows(clauses=CLAUSES)
    for row in data:  # the prompts as the engine sees them: chat template and the tool's schema
        n = len(renderer.prompt_ids(row["prompt"]))
        assert LONG < n < 17_000, n
    # The tiny random model's answers all score 0 on arithmetic: a reward that differs between
    # trajectories (the share of even token ids) gives GRPO a gradient to train on.
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    make_dist(plugin, "even-tokens", "even", "even_tokens_plugin", EVEN_TOKENS)
    train = tmp_path / "tau_like.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in data))
    common = ["ray.address=local", "trainer.world_size=2", "trainer.sequence_parallel=2", f"data.train_files=[{train}]",
              "data.batch_size=1", "rollout.n=2", "rollout.max_new_tokens=16", "rollout.max_response_tokens=96",
              "optim.micro_batch_size=1", "trainer.plot=false",
              "reward.functions=[{name: even_tokens}]"]

    # A model whose context is smaller than the prompts: the data check refuses the run in one line, exit 2,
    # before any rank starts.
    small = tmp_path / "small-context"
    shutil.copytree(tiny_qwen3_path, small)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))
    refused = run_toolrl("train", TINY, *common, f"model.source={small}", f"trainer.output_dir={tmp_path / 'refused'}",
                         path=plugin, env=ENV, timeout=300)
    assert refused.returncode == 2, refused.stderr[-2000:]
    [message] = refused.stderr.strip().splitlines()
    assert "tokens with the chat template and its tools' schemas; the model's context is 8,192 (max_position_embeddings in" \
        in message
    assert "so no response fits" in message

    out = tmp_path / "run"
    start = time.monotonic()
    res = run_toolrl("train", TINY, *common, "trainer.total_steps=2", f"trainer.output_dir={out}", path=plugin, env=ENV,
                     timeout=1500)
    wall = time.monotonic() - start
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = lines(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["trained_tokens"] > 0
        assert m["reward_std"] > 0 and math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
        traces = lines(out / "rollouts" / f"step_{m['step']:05d}.jsonl")
        assert len(traces) == 2
        for t in traces:
            assert len(t["prompt_ids"]) + len(t["response_ids"]) > LONG, (len(t["prompt_ids"]), len(t["response_ids"]))
    placement = json.loads((out / "placement.json").read_text())
    print(f"\ntrain run: {wall:.0f} s; " + "; ".join(
        f"step {m['step']}: rollout {m['rollout_s']:.1f} s, train {m['train_s']:.1f} s, trainer_peak_mb "
        f"{m['trainer_peak_mb']:.0f}, trained rows {m['trainer_tokens_total']:.0f} tokens" for m in metrics))
    assert len(placement["trainer"]) == 2, placement  # two trainer ranks, one sequence-parallel group
