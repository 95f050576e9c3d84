"""The run check of roles (toolrl.processes.run_check.check_roles): a role a session gives turns to, or the model
an agent program asks for, that is not among the run's roles is one line before any weights load (exit 2,
its file and line); so is rollout.roles with an estimator that has no group baseline to give each role its
own. ``toolrl train CONFIG --check`` passes a run whose roles agree."""

from __future__ import annotations

import pytest
from test_config_errors import invoke, one_error_line, write_config
from test_run_check import no_weights_load, passes_with, refused

__all__ = ["no_weights_load"]  # its autouse fixture: weights that load before the check fail the test

DEBATE_SESSION = '''
from toolrl import hookimpl
from toolrl.sessions import EnvironmentSession


class Debate(EnvironmentSession):
    roles = ("solver", "verifier")

    async def role(self):
        return None


@hookimpl
def register_environment_sessions(register):
    register(Debate, name="debate")
'''


@pytest.fixture
def debate(tmp_path, monkeypatch, toolrl_reload_plugins):
    """A session kind ``debate`` that gives turns to the solver and the verifier."""
    from _dists import load_plugin

    load_plugin(tmp_path, monkeypatch, toolrl_reload_plugins, "toolrl-plugin-debate", "debate", "debate_session",
                DEBATE_SESSION)


def test_a_role_a_session_gives_turns_to_must_be_the_runs(tmp_path, debate):
    line, path = refused(tmp_path, "session.name: session 'debate' gives turns to 'verifier', which is not among "
                         "the run's roles (solver)", session={"name": "debate"}, rollout={"roles": ["solver"]})
    assert line.startswith(f"error: {path}:")
    refused(tmp_path, "session.name: session 'debate' gives turns to 'solver', 'verifier', which is not among the "
            "run's roles: it has none (set rollout.roles)", session={"name": "debate"})
    assert passes_with(tmp_path, session={"name": "debate"}, rollout={"roles": ["verifier", "solver"]}) == []


def test_the_model_an_agent_program_asks_for_must_be_a_role(tmp_path):
    agent = {"name": "command", "command": "true", "model": "gpt-9"}
    line, path = refused(tmp_path, "rollout.agent.model: the agent program asks for model 'gpt-9', which is not "
                         "among the run's roles (planner, executor)",
                         rollout={"roles": ["planner", "executor"], "agent": agent})
    assert line.startswith(f"error: {path}:")
    passes_with(tmp_path, rollout={"roles": ["planner", "executor"], "agent": {**agent, "model": "executor"}})


def test_roles_in_one_policy_need_a_group_baseline(tmp_path, debate):
    line, path = refused(tmp_path, "rollout.roles: each role is normalised against its own baseline within its "
                         "group, and algorithm.advantage reinforce_pp has no group baseline",
                         rollout={"roles": ["solver", "verifier"]}, algorithm={"advantage": "reinforce_pp"})
    assert line.startswith(f"error: {path}:")
    result = invoke("train", str(write_config(tmp_path, algorithm={"advantage": "reinforce_pp"})), "--check",
                    "rollout.roles=[solver,verifier]")
    one_error_line(result, "error: override rollout.roles=[solver,verifier]: rollout.roles: each role")
    assert passes_with(tmp_path, rollout={"roles": ["solver", "verifier"]}, algorithm={"advantage": "rloo"},
                       session={"name": "debate"}) == []


def test_a_role_a_data_row_names_must_be_the_runs(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": [{"role": "user", "content": "1+1?"}], "extra_info": {"role": "solver"}}\n'
                    '{"prompt": [{"role": "user", "content": "2+2?"}], "extra_info": {"role": "judge"}}\n')
    data = {"train_files": [str(rows)]}
    refused(tmp_path, f"error: {rows}:2: extra_info.role: 'judge' is not among the run's roles (solver, verifier)",
            data=data, rollout={"roles": ["solver", "verifier"]})
    refused(tmp_path, f"error: {rows}:1: extra_info.role: 'solver' is not among the run's roles: it has none",
            data=data)
    rows.write_text(rows.read_text().replace("judge", "verifier"))
    assert passes_with(tmp_path, data=data, rollout={"roles": ["solver", "verifier"]}) == []


# -- under model.adapters: the run's roles are the adapters' names ---------------------------------

ADAPTERS = {"source": "tiny-qwen3", "adapters": {"solver": {"r": 4}, "verifier": {"r": 4, "frozen": True}}}


def test_under_adapters_a_role_without_an_adapter_is_one_line_before_any_weights_load(tmp_path, debate):
    """A session's role, the model an agent program asks for, a data row's role: each must name an adapter."""
    one = {"source": "tiny-qwen3", "adapters": {"solver": {"r": 4}}}
    line, path = refused(tmp_path, "session.name: session 'debate' gives turns to 'verifier', which is not among "
                         "the run's roles (solver)", model=one, session={"name": "debate"})
    assert line.startswith(f"error: {path}:")
    agent = {"name": "command", "command": "true", "model": "gpt-9"}
    refused(tmp_path, "rollout.agent.model: the agent program asks for model 'gpt-9', which is not among the run's "
            "roles (solver, verifier)", model=ADAPTERS, rollout={"agent": agent})
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": [{"role": "user", "content": "1+1?"}], "extra_info": {"role": "judge"}}\n')
    refused(tmp_path, f"error: {rows}:1: extra_info.role: 'judge' is not among the run's roles (solver, verifier)",
            model=ADAPTERS, data={"train_files": [str(rows)]})
    assert passes_with(tmp_path, model=ADAPTERS, session={"name": "debate"}) == []


def test_under_adapters_a_recorded_row_names_an_adapters_role(tmp_path):
    """data.trajectories: each recorded piece trains its role's adapter, so it must name one (else the step
    that met it stopped with a traceback after the weights loaded)."""
    from toolrl.trajectory import Trajectory

    recorded = tmp_path / "recorded.jsonl"
    for role, why in (("judge", "'judge' is not among"), (None, "None is not among")):
        rows = [Trajectory(trajectory_id=f"t{i}", sample_index=i, group=0, role=r, prompt_ids=[1, 2],
                           response_ids=[3], response_mask=[1], logprobs=[-1.0], reward=float(i))
                for i, r in enumerate(("solver", role))]
        recorded.write_text("".join(t.model_dump_json() + "\n" for t in rows))
        refused(tmp_path, f"error: {recorded}:2: role: {why} the run's roles (solver, verifier): each row trains "
                "its role's adapter", model=ADAPTERS, data={"trajectories": [str(recorded)]})
    recorded.write_text(recorded.read_text().replace('"role":null', '"role":"verifier"'))
    assert passes_with(tmp_path, model=ADAPTERS, data={"trajectories": [str(recorded)]}) == []
