"""``toolrl train`` on the tiny vision-language model (``model.source: tiny-qwen2.5-vl``), with images in
its prompts, killed (SIGKILL) after its second checkpoint and resumed with ``--resume``, gives every
step the figures of the same run left alone: the policy's weights (vision tower included), the optimiser
state and the data order come back from the checkpoint as for a text model."""

import base64
import io
import json

import numpy as np
import pytest
from _processes import straight_and_resumed
from PIL import Image
from test_algorithm_resume import STEPS
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
@pytest.mark.long
def test_a_killed_vlm_run_resumes_to_the_uninterrupted_figures(tmp_path, monkeypatch, toolrl_reload_plugins):
    # The random model's answers are never right: a reward that differs between a group's samples
    # gives every step a gradient, so the optimiser state has something to carry over.
    data = tmp_path / "train.jsonl"
    write_samples(data)

    # rollout.seed=1: with n=2 and 8 new tokens the default seed draws a group of equal rewards at step 1.
    def args(out):
        return ["train", TINY, "model.source=tiny-qwen2.5-vl", f"data.train_files=[{data}]", "data.batch_size=1",
                f"trainer.total_steps={STEPS}", f"trainer.output_dir={out}", "trainer.plot=false",
                "trainer.progress=false", "rollout.n=2", "rollout.max_new_tokens=8", "rollout.max_response_tokens=16",
                "rollout.seed=1", "optim.lr=1.0e-3", "reward.functions=[{name: even_tokens}]"]

    want, got = straight_and_resumed(args, tmp_path, STEPS, monkeypatch, toolrl_reload_plugins)
    assert got == want
    # The trajectories trained on held their prompt's figure, in both runs.
    for run in (tmp_path / "straight", tmp_path / "killed"):
        traces = [t for step in range(1, STEPS + 1) for t in lines(run / "rollouts" / f"step_{step:05d}.jsonl")]
        assert len(traces) == 2 * STEPS
        assert all(len(t["images"]) == 1 and "<|vision_start|><|image_pad|>" in t["prompt_text"] for t in traces)
