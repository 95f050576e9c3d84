"""``toolrl train`` on the tiny vision-language model (``model.source: tiny-qwen2.5-vl``), with images in
its prompts, killed (SIGKILL) after its second checkpoint and resumed with ``--resume``, gives every
step the figures of the same run left alone: the policy's weights (vision tower included), the optimiser
state and the data order come back from the checkpoint as for a text model."""

import base64
import io
import json
import os
import sys

import numpy as np
import pytest
from _dists import EVEN_TOKENS, make_dist, run_toolrl
from _processes import kill_after_checkpoint
from PIL import Image
from test_algorithm_resume import STEPS, computed
from test_trainer import TINY, lines


def png(seed: int, width: int = 56, height: int = 42) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def write_samples(path) -> None:
    """Two prompts, each with its own figure as an image part (the OpenAI/Hugging Face layout)."""
    rows = [{"prompt": [{"role": "user", "content": [{"type": "image", "image": png(seed)},
                                                     {"type": "text", "text": f"What is {seed} + 3?"}]}],
             "reward_model": {"ground_truth": str(seed + 3)}} for seed in (1, 2)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.mark.slow
def test_a_killed_vlm_run_resumes_to_the_uninterrupted_figures(tmp_path):
    # The random model's answers are never right: a reward that differs between a group's samples
    # gives every step a gradient, so the optimiser state has something to carry over.
    (tmp_path / "plugin").mkdir()
    make_dist(tmp_path / "plugin", "even-tokens", "even", "even_tokens_plugin", EVEN_TOKENS)
    data = tmp_path / "train.jsonl"
    write_samples(data)

    # rollout.seed=1: with n=2 and 8 new tokens the default seed draws a group of equal rewards at step 1.
    def args(out):
        return ["train", TINY, "model.source=tiny-qwen2.5-vl", f"data.train_files=[{data}]", "data.batch_size=1",
                f"trainer.total_steps={STEPS}", f"trainer.output_dir={out}", "trainer.plot=false",
                "trainer.progress=false", "rollout.n=2", "rollout.max_new_tokens=8", "rollout.max_response_tokens=16",
                "rollout.seed=1", "optim.lr=1.0e-3", "reward.functions=[{name: even_tokens}]"]

    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "plugin"), os.environ.get("PYTHONPATH")]))}
    straight = run_toolrl(*args(tmp_path / "straight"), env=env, timeout=600)
    assert straight.returncode == 0, straight.stderr[-2000:]
    out = tmp_path / "killed"
    kill_after_checkpoint([sys.executable, "-m", "toolrl", *args(out)], env, out / "checkpoints" / "step_000002")
    assert len(lines(out / "metrics.jsonl")) < STEPS  # it died mid-run
    resumed = run_toolrl(*args(out), "--resume", env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    want = computed(lines(tmp_path / "straight" / "metrics.jsonl"))
    assert [r["step"] for r in want] == list(range(1, STEPS + 1))
    assert all(r["reward_std"] > 0 and r["grad_norm"] > 0 for r in want)  # every step had a gradient
    assert computed(lines(out / "metrics.jsonl")) == want
    # The trajectories trained on held their prompt's figure, in both runs.
    for run in (tmp_path / "straight", out):
        traces = [t for step in range(1, STEPS + 1) for t in lines(run / "rollouts" / f"step_{step:05d}.jsonl")]
        assert len(traces) == 2 * STEPS
        assert all(len(t["images"]) == 1 and "<|vision_start|><|image_pad|>" in t["prompt_text"] for t in traces)
