"""Infrastructure failures are never rewards: a trajectory whose environment failed (a session or tool
raising toolrl.schemas.InfrastructureError, an environment that missed its deadline) ends with
``infra_error`` and is left out of the loss and out of its group's baseline; a group it leaves with
fewer than two trajectories is dropped; the step counts them in ``infra_failures``. The model's own
errors still score."""

import asyncio
import json
import os
from pathlib import Path

import pytest
from toolrl.config import load_config
from toolrl.data.batches import trainable
from toolrl.plugins import get_plugins
from toolrl.plugins.registry import Part
from toolrl.schemas import InfrastructureError
from toolrl.sessions import EnvironmentSession, Reset
from toolrl.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")


def traj(group, k, termination="answered", reward=0.0, piece=0, key=""):
    return Trajectory(trajectory_id=f"g{group}-{k}" + (f"~{piece}" if key else ""), trajectory_key=key, piece=piece,
                      sample_index=group, group=group, prompt_ids=[1], termination=termination, reward=reward)


def test_infra_failures_leave_the_loss_and_the_baseline_and_a_lone_survivor_goes_too():
    g0 = [traj(0, 0, "infra_error"), traj(0, 1), traj(0, 2, "error")]  # a model's error still trains
    g1 = [traj(1, 0, "infra_error"), traj(1, 1, "infra_error"), traj(1, 2)]  # one left: no baseline
    g2 = [traj(2, 0, "max_turns")]  # rollout.n 1, nothing failed: kept
    # A forked trajectory whose last piece failed: every piece goes.
    g3 = [traj(3, 0, "forked", key="g3-0", piece=0), traj(3, 0, "infra_error", key="g3-0", piece=1),
          traj(3, 1), traj(3, 2)]
    kept = trainable(g0 + g1 + g2 + g3)
    assert [t.trajectory_id for t in kept] == ["g0-1", "g0-2", "g2-0", "g3-1", "g3-2"]
    assert trainable(g0[1:]) == g0[1:]


class FlakyServer(EnvironmentSession):
    """An environment whose server cannot be reached for some trajectories (by id: group 0 loses its
    first, group 1 its first two of three); the others score their index ``k`` (0, 1, 2)."""

    async def reset(self, sample):
        group, k = self.context.trajectory_id.split("-g")[1].split("-")
        if (group, k) in {("0", "0"), ("1", "0"), ("1", "1")}:
            raise InfrastructureError("environment server unreachable: connection refused")
        return Reset()

    async def score(self, trajectory):
        return float(self.context.trajectory_id.rsplit("-", 1)[1])


@pytest.mark.slow
def test_a_training_step_leaves_infrastructure_failures_out(tmp_path):
    from toolrl.processes.controller import train_async

    registry = get_plugins().registry
    if not registry.has("environment_sessions", "flaky_server"):
        registry.add(Part("environment_sessions", "flaky_server", "tests", FlakyServer))
    config = load_config(str(ROOT / "examples" / "tiny.yaml"), [
        f"trainer.output_dir={tmp_path}", "trainer.plot=false", "trainer.progress=false", "trainer.total_steps=1",
        "env_options.train_size=4", "rollout.n=3", "rollout.max_new_tokens=4", "rollout.max_response_tokens=8",
        "session.name=flaky_server", "reward.functions=[]", "tools.entries=[]"])
    asyncio.run(train_async(config))
    [row] = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert row["infra_failures"] == 3 and row["terminations"]["infra_error"] == 3
    assert row["groups"] == [0] and row["skipped_groups"] == [1]
    traces = {t["trajectory_id"]: t for t in map(json.loads, (tmp_path / "rollouts" / "step_00001.jsonl").open())}
    trained = {i: t["advantage"] for i, t in traces.items() if t["advantage"] is not None}
    assert sorted(i.split("-", 2)[2] for i in trained) == ["g0-1", "g0-2"], trained  # t1-s<sample>-g0-<k>
    # The baseline is the mean of the two that ran (rewards 1 and 2), not of three with a fake 0.
    a1, a2 = (trained[i] for i in sorted(trained))
    assert a1 < 0 < a2 and a1 == pytest.approx(-a2)
    assert all(traces[i]["error"] and "unreachable" in traces[i]["error"] for i in traces if i not in trained
               and traces[i]["termination"] == "infra_error")


def test_the_failure_summary_counts_trajectories_not_pieces_and_quotes_the_first_errors():
    from toolrl.run_dir import EveryTrajectoryFailed, FailureTally

    tally = FailureTally()
    tally.add([traj(0, 0, "forked", key="g0-0"), traj(0, 0, "answered", key="g0-0", piece=1), traj(0, 1)])
    tally.check()  # none failed
    failed = [traj(1, k, "infra_error" if k else "error") for k in range(5)]
    for t in failed:
        t.error = f"ConnectionError: server {t.trajectory_id} gone\nsecond line"
    tally.add(failed)
    assert tally.headline() == "5 of 7 trajectories ended in errors (4 of them infrastructure failures: not trained)"
    assert tally.first == ["g1-0 [error]: ConnectionError: server g1-0 gone second line",
                           "g1-1 [infra_error]: ConnectionError: server g1-1 gone second line",
                           "g1-2 [infra_error]: ConnectionError: server g1-2 gone second line"]
    tally.check()
    alone = FailureTally()
    alone.add(failed)
    with pytest.raises(EveryTrajectoryFailed, match="^5 of 5 trajectories"):
        alone.check()


class DeadServer(EnvironmentSession):
    """An environment server that is never reachable."""

    async def reset(self, sample):
        raise InfrastructureError("environment server unreachable: connection refused")


@pytest.mark.parametrize("session", [pytest.param("flaky_server", marks=pytest.mark.slow), "dead_server"])
def test_rollout_tells_what_failed_on_stderr_and_fails_only_when_everything_did(tmp_path, session):
    from click.testing import CliRunner
    from toolrl.cli import cli

    registry = get_plugins().registry
    for name, cls in (("flaky_server", FlakyServer), ("dead_server", DeadServer)):
        if not registry.has("environment_sessions", name):
            registry.add(Part("environment_sessions", name, "tests", cls))
    result = CliRunner().invoke(cli, [
        "rollout", str(ROOT / "examples" / "tiny.yaml"), f"trainer.output_dir={tmp_path}", "trainer.plot=false",
        "trainer.progress=false", "trainer.total_steps=1", "env_options.train_size=4", "rollout.n=3",
        "rollout.max_new_tokens=4", "rollout.max_response_tokens=8", f"session.name={session}",
        "reward.functions=[]", "tools.entries=[]"])
    lines = result.stderr.splitlines()
    if session == "flaky_server":
        assert result.exit_code == 0, result.output
        assert "3 of 6 trajectories ended in errors (3 of them infrastructure failures: not trained), first:" in lines
    else:
        assert result.exit_code == 1
        assert lines[-1] == ("error: 6 of 6 trajectories ended in errors (6 of them infrastructure failures: "
                             "not trained): every trajectory failed")
    quoted = [line for line in lines if line.startswith("  e1-")]
    assert len(quoted) == 3 and all("[infra_error]: SessionInfrastructureError: session" in q and "unreachable" in q
                                    for q in quoted), lines


async def test_a_reward_whose_service_is_gone_is_an_infrastructure_failure_and_a_wrong_answer_is_not():
    from toolrl.config import RewardConfig, RolloutConfig
    from toolrl.model_sources import qwen_tokenizer
    from toolrl.parsers.hermes import HermesParser
    from toolrl.renderers.chat import ChatRenderer
    from toolrl.rollout import RolloutContext, Route, run_trajectory
    from toolrl.schemas import Sample
    from toolrl.testing import ScriptedEngine

    def judge(response, ground_truth, **info):
        if ground_truth == "judge down":
            raise InfrastructureError("judge endpoint unreachable: connection refused")
        return float(response.strip().endswith(ground_truth))

    tokenizer = qwen_tokenizer("qwen2_5")
    ctx = RolloutContext(engine=ScriptedEngine(tokenizer, ["<think>\n\n</think>\n\nThe answer is 5."]),
                         renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                         config=RolloutConfig(max_response_tokens=256),
                         routes={None: Route({}, 4, HermesParser(), [("judge", 1.0, judge)], RewardConfig())})
    down, wrong = [await run_trajectory(ctx, Sample(prompt=[{"role": "user", "content": "2 + 2?"}], ground_truth=g),
                                        0, g, seed=0) for g in ("judge down", "4.")]
    assert down.termination == "infra_error" and "judge endpoint unreachable" in down.reward_errors["judge"]
    assert wrong.termination == "answered" and wrong.reward == 0.0 and not wrong.reward_errors
    assert trainable([down, wrong]) == []  # one left of its group: no baseline, dropped too
