"""A run with a non-default advantage estimator and policy loss, killed (SIGKILL) after its second
checkpoint and resumed with ``--resume``, gives every step the figures of the same run left alone:
the critic (``gae``) and the optimiser states come back from the checkpoint as the policy's do."""

import os
import sys

import pytest
from _dists import EVEN_TOKENS, make_dist, run_toolrl
from _processes import kill_after_checkpoint
from test_trainer import TINY, lines

STEPS = 4
# Measured, not computed: they differ from run to run (as in test_trainer's resume test).
TIMING = {"tokens_per_s", "tool_latency_s", "trainer_peak_mb", "weight_sync_peak_mb"}


def computed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.endswith("_s") and k not in TIMING} for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", [
    ["algorithm.advantage=rloo", "algorithm.loss=gspo"],
    ["algorithm.advantage=gae", "critic.lr=1.0e-3"],
], ids=["rloo-gspo", "gae-critic"])
def test_a_killed_run_resumes_to_the_uninterrupted_figures(tmp_path, algorithm):
    # The tiny random model never solves arithmetic (reward 0, nothing to learn): a reward that differs
    # between its samples gives the policy, the optimiser and the critic something to carry over.
    (tmp_path / "plugin").mkdir()
    make_dist(tmp_path / "plugin", "even-tokens", "even", "even_tokens_plugin", EVEN_TOKENS)

    def args(out):
        return ["train", TINY, f"trainer.total_steps={STEPS}", f"trainer.output_dir={out}", "trainer.plot=false",
                "trainer.progress=false", "env_options.train_size=8", "rollout.n=2", "rollout.max_new_tokens=8",
                "rollout.max_response_tokens=16", "reward.functions=[{name: even_tokens}]", *algorithm]

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
    if "algorithm.advantage=gae" in algorithm:
        assert all(r["value_loss"] > 0 and r["critic_grad_norm"] > 0 for r in want)  # the critic trained
    assert computed(lines(out / "metrics.jsonl")) == want
