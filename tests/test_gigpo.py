"""The ``gigpo`` estimator (toolrl.algorithms.gigpo): a hand-worked batch of two groups of multi-turn
trajectories, singleton step groups, the options' edges, single-turn trajectories (a scaled GRPO),
and the rollout loop recording each turn's start and state (toolrl.rollout.turns)."""

import json

import pytest
import torch
from toolrl.algorithms import AdvantageInputs, build_estimator
from toolrl.algorithms.rules import check_algorithm
from toolrl.algorithms.turns import TURN_STATES, turn_rewards, turn_step_rewards
from toolrl.config import AlgorithmConfig, ConfigError, RewardConfig, RolloutConfig, load_config
from toolrl.model_sources import qwen_tokenizer
from toolrl.parsers.hermes import HermesParser
from toolrl.plugins.parts import RunFacts
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout import RolloutContext, Route, run_rollouts
from toolrl.schemas import Sample, ToolResponse, ToolResult
from toolrl.sessions import EnvironmentSession, Reset, SessionKind, StepResult
from toolrl.testing import ScriptedEngine
from toolrl.training.step import token_advantages
from toolrl.trajectory import Trajectory


def gigpo(**options):
    algo = AlgorithmConfig(advantage="gigpo", advantage_options=options)
    return build_estimator(algo), algo


def traj(name, group, mask, starts, states, reward, steps=()):
    """A trajectory with its turns recorded; ``steps``: (turn, step reward) of its calls."""
    results = [ToolResult(name="t", response=ToolResponse(text="ok"), step_reward=r, turn=k) for k, r in steps]
    return Trajectory(trajectory_id=name, sample_index=group, group=group, prompt_ids=[1, 2], response_ids=[9] * len(mask),
                      response_mask=mask, logprobs=[0.0] * len(mask), turns=len(starts), turn_starts=starts,
                      turn_states=states, tool_results=results, reward=reward)


def batch():
    """Two groups. Group 0 (states P, X, Y, Z) and group 1 (Q, X: the same name, another group)."""
    return [
        # a: three turns (P, X, Y), a step reward 0.5 on turn 2, reward 1.0 → earned (0, 0.5, 0.5)
        traj("a", 0, [1, 1, 0, 1, 0, 0, 1, 1], [0, 3, 6], ["P", "X", "Y"], 1.0, [(2, 0.5)]),
        # b: a position before its first turn (outside every turn), turns (P, X), reward 0 → earned (0, 0)
        traj("b", 0, [0, 1, 0, 1], [1, 3], ["P", "X"], 0.0),
        # c: turns (P, Z), step reward 0.25 on turn 1, reward 1.0 → earned (0.25, 0.75)
        traj("c", 0, [1, 0, 1, 1], [0, 2], ["P", "Z"], 1.0, [(1, 0.25)]),
        # d: turns (Q, X), reward 0 → earned (0, 0)
        traj("d", 1, [1, 0, 1], [0, 2], ["Q", "X"], 0.0),
        # e: turns (Q, X, X): it comes back to X; reward 1.0 → earned (0, 0, 1)
        traj("e", 1, [1, 0, 1, 0, 1], [0, 2, 4], ["Q", "X", "X"], 1.0),
    ]


def test_a_hand_worked_batch():
    estimator, algo = gigpo(gamma=0.5, step_weight=1.0, norm_by_std=False)
    grid = token_advantages(batch(), estimator, 64, algo)
    # Returns, γ = 0.5 (R_t = r_t + 0.5 R_{t+1}):
    #   a: R3 = 0.5, R2 = 0.5 + 0.5·0.5 = 0.75, R1 = 0 + 0.5·0.75 = 0.375;  b: (0, 0)
    #   c: R2 = 0.75, R1 = 0.25 + 0.5·0.75 = 0.625;  d: (0, 0);  e: R3 = 1, R2 = 0.5, R1 = 0.25
    # Episode level (norm_by_std false: r - group mean): group 0 mean 2/3 → a 1/3, b -2/3, c 1/3; group 1 mean 1/2 → d -1/2, e 1/2
    # Step groups:
    #   (0, P): a 0.375, b 0, c 0.625, mean 1/3 → a 1/24, b -1/3, c 7/24
    #   (0, X): a 0.75, b 0, mean 0.375 → a 0.375, b -0.375;  (0, Y) a alone, (0, Z) c alone → 0
    #   (1, Q): d 0, e 0.25, mean 0.125 → d -0.125, e 0.125
    #   (1, X): d 0, e 0.5, e 1, mean 0.5 → d -0.5, e 0, e 0.5
    # A = episode + 1.0 · step, over each turn's positions (to the next turn's start):
    a = [1 / 3 + 1 / 24] * 3 + [1 / 3 + 0.375] * 3 + [1 / 3] * 2  # 0.375, 0.7083, 0.3333
    b = [0.0] + [-2 / 3 - 1 / 3] * 2 + [-2 / 3 - 0.375]  # outside: 0; then -1, -1.0417
    c = [1 / 3 + 7 / 24] * 2 + [1 / 3] * 2  # 0.625, 0.3333
    d = [-0.5 - 0.125] * 2 + [-0.5 - 0.5]  # -0.625, -1.0
    e = [0.5 + 0.125] * 2 + [0.5 + 0.0] * 2 + [0.5 + 0.5]  # 0.625, 0.5, 1.0
    expected = torch.zeros(5, 8)  # padding positions: outside every turn, 0
    for i, row in enumerate((a, b, c, d, e)):
        expected[i, :len(row)] = torch.tensor(row)
    assert grid.dtype == torch.float32 and grid.shape == (5, 8)
    torch.testing.assert_close(grid, expected, rtol=0, atol=1e-6)


def test_std_normalisation_at_both_levels():
    estimator, algo = gigpo(gamma=1.0, eps=1e-6)
    # One group of two, both through states (P, X): rewards 1 and 0, no step rewards.
    trajs = [traj("a", 0, [1, 0, 1], [0, 2], ["P", "X"], 1.0), traj("b", 0, [1, 0, 1], [0, 2], ["P", "X"], 0.0)]
    grid = token_advantages(trajs, estimator, 64, algo)
    # Any group of two values x > y: (x - mean) / std = ((x - y) / 2) / ((x - y) / √2) = 1/√2 (std unbiased).
    # γ = 1: every turn's return is the reward, so each level gives ±1/√2 and A = ±√2.
    half = 0.5 / (0.5 ** 0.5 + 1e-6)
    torch.testing.assert_close(grid, torch.tensor([[2 * half] * 3, [-2 * half] * 3]), rtol=0, atol=1e-6)


def test_singleton_step_groups_leave_the_episode_advantage():
    estimator, algo = gigpo(gamma=0.9)
    # Every state its own: no step group has two members, so A = A_E on every turn's tokens.
    trajs = [traj("a", 0, [1, 0, 1], [0, 2], ["P1", "X"], 1.0), traj("b", 0, [1, 0, 1], [0, 2], ["P2", "Y"], 0.0)]
    grid = token_advantages(trajs, estimator, 64, algo)
    grpo = token_advantages(trajs, build_estimator(AlgorithmConfig()), 64, AlgorithmConfig())
    torch.testing.assert_close(grid, grpo)


def test_step_weight_zero_is_the_episode_level_alone():
    trajs = batch()
    estimator, algo = gigpo(step_weight=0.0, norm_by_std=False)
    grid = token_advantages(trajs, estimator, 64, algo)
    dr = token_advantages(trajs, build_estimator(AlgorithmConfig(advantage="dr_grpo")), 64, AlgorithmConfig())
    inside = torch.zeros_like(grid, dtype=torch.bool)
    for i, t in enumerate(trajs):
        inside[i, t.turn_starts[0]:len(t.response_ids)] = True
    assert torch.equal(grid, torch.where(inside, dr, 0.0))


@pytest.mark.parametrize("by_std,grpo", [(True, AlgorithmConfig()), (False, AlgorithmConfig(advantage="dr_grpo"))])
def test_single_turn_trajectories_get_a_scaled_grpo(by_std, grpo):
    # One turn from the prompt (one state per group): the step group is the episode group and the
    # return is the reward (γ^0), so A = (1 + ω) · GRPO's.
    trajs = [traj(f"t{i}", i // 3, [1, 1, 1], [0], [f"prompt{i // 3}"], r) for i, r in enumerate([1.0, 0.0, 0.5, 0.2, 0.9, 0.9])]
    for weight in (0.0, 1.0, 0.5):
        estimator, algo = gigpo(step_weight=weight, norm_by_std=by_std)
        expected = (1 + weight) * token_advantages(trajs, build_estimator(grpo), 64, grpo)
        torch.testing.assert_close(token_advantages(trajs, estimator, 64, algo), expected)


@pytest.mark.parametrize("options", [{"gamma": 0.0}, {"gamma": 1.5}, {"step_weight": -0.1}, {"norm_by_std": "max"},
                                     {"eps": 0.0}, {"lam": 1.0}])
def test_options_are_checked(options):
    with pytest.raises(ConfigError, match="advantage_options"):
        gigpo(**options)


def test_trajectories_without_turns_are_refused():
    estimator, algo = gigpo()
    bare = Trajectory(trajectory_id="agent-1", sample_index=0, group=0, prompt_ids=[1], response_ids=[5, 6],
                      response_mask=[1, 1], logprobs=[0.0, 0.0], reward=1.0)
    with pytest.raises(ValueError, match="agent-1 records no turns"):
        token_advantages([bare], estimator, 64, algo)
    inputs = AdvantageInputs(torch.tensor([1.0], dtype=torch.float64), torch.tensor([0]), torch.ones(1, 2))
    with pytest.raises(ValueError, match="gigpo reads each row's turns"):
        estimator(inputs)


# -- the rollout loop records each turn's start and state ------------------------------------------


def call(**arguments):
    return "<tool_call>\n" + json.dumps({"name": "walk", "arguments": arguments}) + "\n</tool_call>"


class Maze(EnvironmentSession):
    """A corridor: ``walk(to)`` moves there; its state key is the room, when ``keyed``."""

    keyed = True
    WALK = {"type": "function", "function": {"name": "walk", "description": "Walk.", "parameters": {
        "type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}}}

    async def reset(self, sample):
        self.room = "hall"
        return Reset(tools=[self.WALK])

    def step(self, call):
        self.room = call.arguments["to"]
        return StepResult(response=f"You are in the {self.room}.", reward=0.25 if self.room == "attic" else None)

    async def state_key(self):
        return self.room if self.keyed else None


class UnkeyedMaze(Maze):
    keyed = False


async def rollouts(session):
    tokenizer = qwen_tokenizer("qwen2_5")
    # Two paths to the attic: one through the cellar. b and c walk the same way.
    scripts = {"g0-0": [call(to="cellar"), call(to="attic"), "Done."],
               "g0-1": [call(to="attic"), "Done."], "g0-2": [call(to="attic"), "Done."]}
    kind = SessionKind(session.__name__.lower(), session, session.Options(), ".")
    context = RolloutContext(engine=ScriptedEngine(tokenizer, scripts),
                             renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                             config=RolloutConfig(max_response_tokens=1024),
                             routes={None: Route({}, 6, HermesParser(), [], RewardConfig(), kind)})
    return await run_rollouts(context, [Sample(prompt=[{"role": "user", "content": "Find the attic."}])], n=3, seed=0)


def model_runs(mask):
    """Where each run of model tokens (mask 1) starts."""
    return [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]


async def test_the_rollout_records_turns_with_the_session_key_or_the_observation():
    keyed, unkeyed = await rollouts(Maze), await rollouts(UnkeyedMaze)
    for trajs in (keyed, unkeyed):
        for t in trajs:  # each turn starts where a run of model tokens starts
            assert t.turn_starts == model_runs(t.response_mask) and len(t.turn_states) == t.turns
    a, b, c = keyed
    assert a.turn_states == ["env:hall", "env:cellar", "env:attic"] and b.turn_states == ["env:hall", "env:attic"]
    # Without a session key: the prompt's tokens, then the tool result's; the attic, reached either way, is one state.
    a, b, c = unkeyed
    assert all(s.startswith("obs:") for s in a.turn_states)
    assert a.turn_states[0] == b.turn_states[0] == c.turn_states[0] and a.turn_states[1] != b.turn_states[1]
    assert a.turn_states[2] == b.turn_states[1] == c.turn_states[1]
    # gigpo reads them; the step reward 0.25 is the turn's that reached the attic.
    estimator, algo = gigpo()
    grid = token_advantages(keyed, estimator, 1024, algo)
    assert grid.shape[0] == 3 and torch.isfinite(grid).all()
    a = keyed[0]
    assert turn_rewards(turn_step_rewards(a), a.reward) == [0.0, 0.25, a.reward - 0.25]


def test_an_agent_program_run_is_refused_before_anything_loads():
    def facts(**rollout):
        return RunFacts(load_config(None, data={"env": "arithmetic", "rollout": rollout}), "", {}, {}, None, None)

    estimator, _ = gigpo()
    assert estimator.check_run(facts()) == []
    with pytest.raises(ConfigError, match=r"^rollout.agent: gigpo credits each model turn, .* record no turns"):
        estimator.check_run(facts(agent={"name": "command", "command": "x"}))


def test_malformed_turn_records_are_refused():
    estimator, algo = gigpo()
    for starts, states in (([2, 0], ["P", "X"]), ([0], ["P", "X"]), ([-1], ["P"])):
        with pytest.raises(ValueError, match="one key per turn"):
            token_advantages([traj("a", 0, [1, 0, 1], starts, states, 1.0)], estimator, 64, algo)


class JunkKeyMaze(Maze):
    def state_key(self):  # a plain def runs in a thread, as every session method may
        return 42


async def test_a_session_key_that_is_not_a_str_ends_its_trajectory():
    for t in await rollouts(JunkKeyMaze):
        assert t.termination == "error" and "state_key must return a str or None, got int" in t.error


def test_a_config_names_gigpo_and_its_options():
    def config(*overrides):
        return load_config(None, ["algorithm.advantage=gigpo", *overrides], data={"env": "arithmetic"})

    estimator, _ = check_algorithm(config("algorithm.advantage_options={gamma: 0.9, norm_by_std: false}"))
    assert estimator.name == "gigpo" and estimator.options.gamma == 0.9 and TURN_STATES in estimator.reads
    # The option grpo and tree_grpo share, under its old name: one line naming the new one.
    with pytest.raises(ConfigError, match=r"^override algorithm.advantage_options=\{norm: mean\}: algorithm.advantage_options: norm was renamed norm_by_std, as grpo and tree_grpo name it \(std: true, mean: false\)$"):
        check_algorithm(config("algorithm.advantage_options={norm: mean}"))
    with pytest.raises(ConfigError, match=r"^override algorithm.advantage_options.gamma=0: .*greater than 0"):
        check_algorithm(config("algorithm.advantage_options.gamma=0"))
    with pytest.raises(ConfigError, match="a sequence-level loss needs one advantage per sequence"):
        check_algorithm(config("algorithm.loss=gspo"))


async def test_each_piece_of_a_segmented_trajectory_keeps_its_own_turns():
    from toolrl.config import Config
    from toolrl.rollout import run_trajectory_pieces
    from toolrl.rollout.routes import build_context_policy

    # The window policy past 1 token: each round of results opens a new segment (piece).
    policy = build_context_policy(Config.model_validate({"data": {"train_files": ["x.jsonl"]}, "rollout": {
        "context": {"name": "window", "keep_turns": 1, "trigger_tokens": 1}}}))
    tokenizer = qwen_tokenizer("qwen2_5")
    kind = SessionKind("maze", Maze, Maze.Options(), ".")
    context = RolloutContext(engine=ScriptedEngine(tokenizer, [call(to="attic"), call(to="attic"), "Done."]),
                             renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                             config=RolloutConfig(max_response_tokens=2048),
                             routes={None: Route({}, 6, HermesParser(), [], RewardConfig(), kind, context=policy)})
    pieces = await run_trajectory_pieces(context, Sample(prompt=[{"role": "user", "content": "Go."}]), 0, "t", 0)
    # The edit after the second round closes the first piece: its two turns go with it, the last turn stays.
    assert [p.termination for p in pieces] == ["forked", "answered"]
    assert [p.turn_states for p in pieces] == [["env:hall", "env:attic"], ["env:attic"]]
    assert all(p.turn_starts == model_runs(p.response_mask) for p in pieces)
    # The calls' results (0.25 each, turns 1 and 2) stay on the last piece: each piece is a sequence of its own,
    # and one whose turns made no call it holds gets the whole reward (0.5) on its last turn.
    assert [turn_rewards(turn_step_rewards(p), p.reward) for p in pieces] == [[0.0, 0.5], [0.5]]


async def test_sessions_are_asked_for_state_keys_only_when_an_estimator_reads_them():
    """``RolloutContext.state_keys`` (set from the run's estimator's ``reads``): off, the
    session's state_key is never called and the observation's key stands in."""
    asked = []

    class Counted(Maze):
        async def state_key(self):
            asked.append(self.room)
            return self.room

    tokenizer = qwen_tokenizer("qwen2_5")
    kind = SessionKind("counted", Counted, Counted.Options(), ".")
    context = RolloutContext(engine=ScriptedEngine(tokenizer, [call(to="attic"), "Done."]),
                             renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                             config=RolloutConfig(max_response_tokens=1024), state_keys=False,
                             routes={None: Route({}, 6, HermesParser(), [], RewardConfig(), kind)})
    [t] = await run_rollouts(context, [Sample(prompt=[{"role": "user", "content": "Go."}])], n=1, seed=0)
    assert asked == [] and len(t.turn_states) == 2 and all(s.startswith("obs:") for s in t.turn_states)
