"""The agent-benchmark figures of ``toolrl eval``: pass^k (τ-bench), the per-turn success rate and the
turns and calls of solved episodes, on hand-built trajectories; ``--compare`` prints them for A and B.
plugins/tau2/tests/test_pass_hat_k.py checks pass^k against τ²-bench's own function."""

import itertools
import json
import math

import pytest
from click.testing import CliRunner
from toolrl.cli import cli
from toolrl.config import load_config
from toolrl.processes.evaluate import pass_at_k, pass_hat_k, summarize, turn_outcomes
from toolrl.schemas import Sample, ToolResponse, ToolResult
from toolrl.trajectory import Trajectory


def test_pass_hat_k_by_hand():
    # 3 of 4 tries succeed: of the C(4,2) = 6 pairs of tries, C(3,2) = 3 are both successes.
    assert pass_hat_k(4, 3, 2) == pytest.approx(0.5)
    assert pass_hat_k(4, 3, 3) == pytest.approx(0.25)  # 1 of the 4 triples
    assert pass_hat_k(4, 3, 4) == 0.0 and pass_hat_k(4, 4, 4) == 1.0
    assert pass_hat_k(4, 3, 1) == pass_at_k(4, 3, 1) == 0.75  # one try: both are the success rate
    with pytest.raises(ValueError, match="pass\\^k needs"):
        pass_hat_k(2, 1, 3)


@pytest.mark.parametrize("n", range(1, 7))
def test_pass_hat_k_is_the_chance_that_k_of_the_n_tries_all_succeed(n):
    for c, k in itertools.product(range(n + 1), range(1, n + 1)):
        subsets = list(itertools.combinations([True] * c + [False] * (n - c), k))
        assert pass_hat_k(n, c, k) == pytest.approx(sum(all(s) for s in subsets) / len(subsets), abs=1e-12)


def call(turn: int, status: str = "ok") -> ToolResult:
    return ToolResult(name="lookup", response=ToolResponse(text="x"), status=status, turn=turn)


def traj(group: int, reward: float, turns: int, calls: list[ToolResult]) -> Trajectory:
    return Trajectory(trajectory_id=f"t{group}", sample_index=group, group=group, prompt_ids=[1], turns=turns,
                      reward=reward, tool_results=calls)


def test_summary_reports_pass_hat_k_turn_success_and_solved_episodes():
    config = load_config(None, ["env=arithmetic", "eval.n=4", "eval.temperature=1.0"])
    a, b = Sample(prompt="a", index=0), Sample(prompt="b", index=1)
    # Problem a: 4 of 4 solved, each in 3 turns with 2 calls; problem b: 1 of 4, with failing calls.
    solved = [traj(0, 1.0, 3, [call(1), call(2)]) for _ in range(4)]
    mixed = [traj(1, 1.0, 4, [call(1), call(2, "error"), call(3)]),
             traj(1, 0.0, 2, [call(1, "invalid_arguments"), call(1)]),
             traj(1, 0.0, 1, []), traj(1, 0.0, 1, [])]
    results = [(a, k, t) for k, t in enumerate(solved)] + [(b, k, t) for k, t in enumerate(mixed)]
    summary = summarize(results, config, 1.0)
    assert summary["pass@1"] == pytest.approx((1 + 0.25) / 2)
    assert summary["pass@k"] == 1.0 and summary["pass^k"] == pytest.approx((1 + 0) / 2)
    # 8 + 3 + 2 = 13 calls, 2 failed; 12 turns made calls: 8 + 3 (its turn 2 failed) + 1 (two calls, one failed).
    assert summary["tool_success_rate"] == pytest.approx(11 / 13)
    assert summary["turn_success_rate"] == pytest.approx(10 / 12)
    assert summary["solved_turns_mean"] == pytest.approx((4 * 3 + 4) / 5)
    assert summary["solved_tool_calls_mean"] == pytest.approx((4 * 2 + 3) / 5)
    assert turn_outcomes(mixed[1]) == [False]
    nothing = summarize([(b, 0, traj(1, 0.0, 1, []))], load_config(None, ["env=arithmetic"]), 1.0)
    assert nothing["turn_success_rate"] is None and nothing["solved_turns_mean"] is None  # nothing to average


def test_an_infrastructure_failure_is_counted_apart_not_as_a_failed_try():
    config = load_config(None, ["env=arithmetic", "eval.n=2", "eval.temperature=1.0"])
    a, b = Sample(prompt="a", index=0), Sample(prompt="b", index=1)
    down = traj(1, 0.0, 1, [call(1, "infra_error")]).model_copy(update={"termination": "infra_error",
                                                                         "error": "sandbox unreachable"})
    wrong = traj(1, 0.0, 1, [call(1, "error")]).model_copy(update={"termination": "error", "error": "bad call"})
    results = [(a, 0, traj(0, 1.0, 1, [call(1)])), (a, 1, wrong), (b, 0, traj(1, 1.0, 1, [call(1)])), (b, 1, down)]
    summary = summarize(results, config, 1.0)
    assert summary["infra_failures"] == 1 and summary["errors"] == 1  # the model's own error still counts
    assert summary["num_samples"] == 2 and summary["num_trajectories"] == 4
    assert summary["pass@1"] == pytest.approx((0.5 + 1.0) / 2)  # b: one try of the model, solved
    assert summary["pass@k"] == 1.0 and summary["pass^k"] == 0.0  # only a kept both tries
    assert summary["tool_success_rate"] == pytest.approx(2 / 3) and summary["reward_mean"] == pytest.approx(2 / 3)
    assert summary["terminations"]["infra_error"] == 1


def test_compare_shows_the_agent_figures_for_a_and_b(tmp_path):
    for name, hat in (("a", 0.25), ("b", 0.75)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(
            {"pass@k": 1.0, "pass^k": hat, "turn_success_rate": hat, "solved_turns_mean": 3.0,
             "solved_tool_calls_mean": 2.0}))
    out = CliRunner().invoke(cli, ["eval", str(tmp_path / "a"), "--compare", str(tmp_path / "b")]).output
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in out.splitlines() if line.count("│") >= 4}
    assert rows["pass^k"] == ["0.25", "0.75", "0.5"] and rows["turn_success_rate"] == ["0.25", "0.75", "0.5"]
    assert rows["solved_turns_mean"] == ["3", "3", "0"] and rows["solved_tool_calls_mean"] == ["2", "2", "0"]
    assert not math.isnan(float(rows["pass@k"][2]))
