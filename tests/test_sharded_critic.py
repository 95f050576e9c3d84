"""PPO with a critic on real Ray with two gloo ranks (FSDP2 for the policy and the critic): the same
rollouts, gradient norms and value figures as one rank, and after a rank is killed ``--resume``
restores the critic and continues as the uninterrupted run did."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from test_sharded_training import cluster, config, kill_rank_after_checkpoint, lines, train  # noqa: F401

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # three Ray runs: minutes on two shared cores

STEPS = 2
VALUE_FIGURES = ("value_loss", "value_mean", "return_mean", "critic_grad_norm")


def gae_config(out: Path, world_size: int, extra: tuple[str, ...] = ()):
    from toolrl.algorithms.rules import with_critic

    cfg = config(out, world_size, STEPS, extra=extra)
    algorithm = cfg.algorithm.model_copy(update={"advantage": "gae"})
    return with_critic(cfg.model_copy(update={"algorithm": algorithm}))


def close(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * max(abs(a), 1e-6)


@pytest.fixture(scope="module")
def two_ranks(cluster, tmp_path_factory):  # noqa: F811
    return train(gae_config(tmp_path_factory.mktemp("gae2") / "run", 2))


# A third Ray run; the critic's two-rank update equals one rank's in test_critic.py (a gloo group, no Ray),
# so this one is in the long session.
@pytest.mark.timeout(900)
@pytest.mark.long
def test_two_ranks_with_a_critic_train_like_one(cluster, two_ranks, tmp_path):  # noqa: F811
    one = train(gae_config(tmp_path / "w1", 1))
    m1, m2 = lines(one / "metrics.jsonl"), lines(two_ranks / "metrics.jsonl")
    assert [m["step"] for m in m2] == list(range(1, STEPS + 1))
    for a, b in zip(m1, m2, strict=True):
        assert [t["reward"] for t in lines(one / "rollouts" / f"step_{a['step']:05d}.jsonl")] == \
            [t["reward"] for t in lines(two_ranks / "rollouts" / f"step_{b['step']:05d}.jsonl")]
        assert a["grad_norm"] > 0 and close(a["grad_norm"], b["grad_norm"], 1e-3), (a["grad_norm"], b["grad_norm"])
        for k in VALUE_FIGURES:
            assert close(a[k], b[k], 1e-3), (k, a[k], b[k])
    assert m1[-1]["value_mean"] != 0.0  # the critic moved after step 1


# long: the second test of what default tests cover (test_critic.py::test_a_trainer_rank_trains_its_critic_and_resume
# _restores_it: the critic's state restored on resume; test_sharded_training.py::test_a_rank_killed_before_its_copy_is
# _complete_trains_the_step_again: a killed trainer rank replaced), about three minutes.
@pytest.mark.long
@pytest.mark.timeout(900)
def test_resume_after_a_killed_rank_restores_the_critic(cluster, two_ranks, tmp_path):  # noqa: F811
    from toolrl.processes.trainer_group import TrainerFailed

    run = tmp_path / "killed"
    found: dict[str, Any] = {}
    killer = threading.Thread(target=kill_rank_after_checkpoint, args=(run, 1, 1, found), daemon=True)
    killer.start()
    stop = ("trainer.on_rank_failure=stop",)  # the run stops; a person resumes it
    with pytest.raises(TrainerFailed, match="died during step 2"):
        train(gae_config(run, 2, stop))
    killer.join(timeout=5)
    train(gae_config(run, 2, stop), resume=True)
    resumed, want = lines(run / "metrics.jsonl"), lines(two_ranks / "metrics.jsonl")
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1)) and "failed" not in resumed[-1]
    for k in ("grad_norm", *VALUE_FIGURES):  # step 2 reads the critic the checkpoint restored
        assert close(resumed[-1][k], want[-1][k], 1e-6), (k, resumed[-1][k], want[-1][k])
