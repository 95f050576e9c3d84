"""Oracle replay: each task's ground-truth actions, played as tool calls through toolrl's rollout
loop and the ``tau2`` session, score what τ² itself gives the same play (1.0 for every task but the
mock domain's one whose criteria hold no action: τ²'s gold actions do not meet its env assertion);
one altered action scores less, and τ²'s error answers are error results."""

from __future__ import annotations

import pytest
from conftest import rollout
from oracle import OracleEngine, answer, call, ground_truth, reference
from toolrl_tau2 import domain

READS = ("get_", "search_", "list_", "calculate", "transfer_")


async def test_every_mock_task_scores_as_tau2_does(tokenizer) -> None:
    tasks = domain.tasks("mock", "train")
    trajs = await rollout("tau2-mock", OracleEngine(tokenizer, tasks), tokenizer)
    assert len(trajs) == len(tasks) == 9
    by_id = {t.id: t for t in tasks}
    expected = {t.id: reference("mock", t) for t in tasks}
    assert [i for i, r in expected.items() if r != 1.0] == ["update_task_with_history_and_env_assertions"]
    for t in trajs:
        assert t.error is None and t.termination == "answered", (t.ground_truth, t.error)
        assert t.reward == t.reward_terms["tau2"] == expected[t.ground_truth], (t.ground_truth, t.reward_parts)
        assert [r.name for r in t.tool_results] == [n for n, _ in ground_truth(by_id[t.ground_truth])]
        assert all(r.status == "ok" for r in t.tool_results)
    # τ²'s parts are in the trace, named by the task's reward basis.
    assert {k.split(".", 1)[1] for t in trajs for k in t.reward_parts} >= {"DB", "ENV_ASSERTION", "ACTION"}
    # The two tasks that start from a conversation have it in their prompt, before the opening.
    [history] = [t for t in trajs if t.ground_truth == "update_task_with_message_history"]
    assert "I need to create a task for the project review meeting." in tokenizer.decode(history.prompt_ids)


async def test_solo_mock_leaves_out_tasks_that_start_with_a_user(tokenizer) -> None:
    tasks = [t for t in domain.tasks("mock", "train") if not domain.user_in_history(t)]
    trajs = await rollout("tau2-mock", OracleEngine(tokenizer, tasks), tokenizer, env_options={"solo": True})
    assert len(trajs) == len(tasks) == 7
    expected = {t.id: reference("mock", t, solo=True) for t in tasks}
    assert all(t.error is None and t.reward == expected[t.ground_truth] for t in trajs), \
        [(t.ground_truth, t.reward_parts) for t in trajs]


async def test_a_tau2_error_answer_is_an_error_result(tokenizer) -> None:
    tasks = domain.tasks("mock", "train")
    task = next(t for t in tasks if any(n == "update_task_status" for n, _ in ground_truth(t)))
    script = [call("update_task_status", {"task_id": "no_such_task", "status": "completed"}), answer(task)]
    [t] = await rollout("tau2-mock", OracleEngine(tokenizer, tasks, altered={task.id: script}), tokenizer,
                        only={task.id})
    [result] = t.tool_results
    assert result.status == "error" and result.response.text.startswith("Error:"), result
    assert t.error is None and t.reward == 0.0


async def test_eight_airline_tasks_score_as_tau2_does_and_an_altered_action_less(tokenizer) -> None:
    await replay_airline(tokenizer, 8)


@pytest.mark.slow  # the eight above and twelve more: a minute on 2 cores (nox -s "plugin(tau2)" -- -m slow)
@pytest.mark.timeout(600)  # 262 s measured on the shared 2-core machine (load average ~27)
async def test_twenty_airline_tasks_score_as_tau2_does_and_an_altered_action_less(tokenizer) -> None:
    await replay_airline(tokenizer, 20)


async def replay_airline(tokenizer, count: int) -> None:
    """The first ``count`` airline tasks with actions, replayed: each scores τ²'s 1.0; then the same
    play with one action altered scores 0."""
    tasks = domain.tasks("airline", "train")
    chosen = [t.id for t in tasks if t.evaluation_criteria.actions][:count]
    # Four at a time: each τ² evaluation loads the 7 MB airline database twice (its gold and predicted
    # environments), and all at once would starve each other's calc_reward past its deadline.
    trajs = await rollout("tau2-airline", OracleEngine(tokenizer, tasks), tokenizer, only=set(chosen),
                          max_concurrent_trajectories=4)
    assert sorted(t.ground_truth for t in trajs) == sorted(chosen)
    index = domain.task_index("airline")
    for t in trajs:
        assert t.error is None and t.reward == reference("airline", index[t.ground_truth]) == 1.0, \
            (t.ground_truth, t.error, t.reward_parts)
        assert {k.split(".", 1)[1] for k in t.reward_parts} >= {"DB", "COMMUNICATE"}

    # The same run with one action altered: a string argument of the first write that has one.
    task, k, key = next((task, i, key) for task in map(domain.task_index("airline").get, chosen)
                        for i, (name, args) in enumerate(ground_truth(task)) if not name.startswith(READS)
                        for key, v in args.items() if isinstance(v, str))
    actions = ground_truth(task)
    actions[k][1][key] += "X"
    engine = OracleEngine(tokenizer, tasks, altered={task.id: [call(n, a) for n, a in actions] + [answer(task)]})
    [t] = await rollout("tau2-airline", engine, tokenizer, only={task.id})
    assert t.error is None and t.reward == 0.0 and 0.0 in t.reward_parts.values(), t.reward_parts
