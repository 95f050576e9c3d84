"""A run with a non-default advantage estimator and policy loss, named in the config, killed (SIGKILL) after its second
checkpoint and resumed with ``--resume``, gives every step the figures of the same run left alone:
the critic (``gae``) and the optimiser states come back from the checkpoint as the policy's do."""

import pytest
from _processes import straight_and_resumed
from test_trainer import TINY, lines

STEPS = 4


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", [
    # long: a killed run resumed to the uninterrupted figures is test_async.py::test_a_killed_one_step_off_run_resumes_to
    # _the_uninterrupted_figures's (slow), a resume restoring exact state test_trainer.py::test_resume_restores_identical
    # _state's; RLOO and GSPO keep no state of their own (under two minutes).
    pytest.param(["algorithm.advantage=rloo", "algorithm.loss=gspo"], marks=pytest.mark.long),
    pytest.param(["algorithm.advantage=gae", "critic.lr=1.0e-3"], marks=pytest.mark.long),
], ids=["rloo-gspo", "gae-critic"])
def test_a_killed_run_resumes_to_the_uninterrupted_figures(tmp_path, monkeypatch, toolrl_reload_plugins, algorithm):
    def args(out):
        return ["train", TINY, f"trainer.total_steps={STEPS}", f"trainer.output_dir={out}", "trainer.plot=false",
                "trainer.progress=false", "env_options.train_size=8", "rollout.n=2", "rollout.max_new_tokens=8",
                "rollout.max_response_tokens=16", "reward.functions=[{name: even_tokens}]", *algorithm]

    want, got = straight_and_resumed(args, tmp_path, STEPS, monkeypatch, toolrl_reload_plugins)
    if "algorithm.advantage=rloo" in algorithm:  # each trace records its RLOO advantage: its reward less
        for step in range(1, STEPS + 1):  # the mean of its group's others (so they sum to 0 per group)
            traces = lines(tmp_path / "straight" / "rollouts" / f"step_{step:05d}.jsonl")
            for t in traces:
                others = [u["reward"] for u in traces if u["group"] == t["group"] and u is not t]
                assert t["advantage"] == pytest.approx(t["reward"] - sum(others) / len(others), abs=1e-6)
    if "algorithm.advantage=gae" in algorithm:
        assert all(r["value_loss"] > 0 and r["critic_grad_norm"] > 0 for r in want)  # the critic trained
    assert got == want
