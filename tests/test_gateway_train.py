"""``toolrl train`` with ``rollout.agent``: an agent program's episodes, run against the tiny model being
trained, are what the step trains on; bad agent settings fail before any model loads."""

from __future__ import annotations

import asyncio
import json
import re
import textwrap
from pathlib import Path

import pytest
import yaml
from toolrl.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny.yaml"

AGENT = textwrap.dedent('''
    """An agent program as a user writes it: its own tool, its own loop, the OpenAI client it is given."""
    import json

    CALCULATOR = {"type": "function", "function": {"name": "calculate", "description": "Evaluate arithmetic.",
                  "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                 "required": ["expression"]}}}
    CALLS = []


    async def run(task, client):
        messages = list(task["prompt"])
        for _ in range(2):
            reply = await client.chat.completions.create(model="toolrl", messages=messages, tools=[CALCULATOR],
                                                         max_tokens=8)
            message = reply.choices[0].message
            CALLS.append(reply.id)
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "0"})
        # The tiny model's answers are noise: a reward that varies with them gives the step a gradient.
        return float(len(message.content or "") % 2)
''')


def agent_config(tmp_path, more=None, **agent):
    config = yaml.safe_load(TINY.read_text())
    config["rollout"].update({"n": 2, "max_new_tokens": 8, "max_response_tokens": 48, "agent": agent})
    for section, values in (more or {}).items():
        config.setdefault(section, {}).update(values)
    config["env_options"]["train_size"] = 4
    config["trainer"].update({"total_steps": 1, "output_dir": str(tmp_path / "run"), "plot": False,
                              "progress": False})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_train_runs_the_agent_program_and_trains_on_its_calls(tmp_path, monkeypatch):
    from toolrl.processes.controller import train_async

    (tmp_path / "tiny_agent.py").write_text(AGENT)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = load_config(str(agent_config(tmp_path, callable="tiny_agent:run")))
    run = asyncio.run(train_async(config))
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (run / "rollouts" / "step_00001.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and metrics[0]["loss"] == metrics[0]["loss"]  # a step trained (not NaN)
    assert rows and all(r["termination"] in ("answered", "length", "forked") for r in rows)
    # The program's reward beside the environment's reward function (arithmetic's gsm8k, on the last answer).
    assert all(set(r["reward_terms"]) == {"agent", "gsm8k"} for r in rows if r["termination"] != "forked")
    import tiny_agent

    # Every call the program made is in the trained rows: one generation (mask-1 run) per call.
    runs = sum(sum(1 for k, m in enumerate(r["response_mask"]) if m and (k == 0 or not r["response_mask"][k - 1]))
               for r in rows)
    assert runs == len(tiny_agent.CALLS)


@pytest.mark.parametrize(("agent", "expected"), [
    ({"command": "python agent.py", "timeout_s": 0}, r"run\.yaml:\d+: rollout\.agent\.timeout_s: Input should be greater than 0"),
    ({"command": "python agent.py", "failures": "mask"}, r"rollout\.agent\.failures: unknown key"),
    ({"name": "comand", "command": "x"}, r"rollout\.agent\.name: unknown agent 'comand'.*did you mean 'command'"),
    ({"callable": "no_colon"}, r"rollout\.agent\.callable: 'no_colon' is not package\.module:function"),
    ({"command": ""}, r"rollout\.agent\.command: names no program"),
])
def test_bad_agent_settings_are_one_line_naming_the_field(tmp_path, agent, expected):
    from toolrl.rollout.routes import resolve_parts

    with pytest.raises(ConfigError, match=expected) as caught:
        resolve_parts(load_config(str(agent_config(tmp_path, **agent))))
    assert "\n" not in str(caught.value)


def test_the_run_check_finds_a_program_that_cannot_start(tmp_path):
    from toolrl.processes.prepare import check_training

    with pytest.raises(ConfigError, match=r"rollout\.agent: command: 'no-such-agent-program' is not on PATH"):
        check_training(load_config(str(agent_config(tmp_path, command="no-such-agent-program --fast"))))
    # A Python program's file: missing, every episode would fail once the model loaded; ``-m``/``-c`` name none.
    with pytest.raises(ConfigError, match=r"run\.yaml:\d+: rollout\.agent: command: the program missing_agent\.py does "
                                          rf"not exist \(in {re.escape(str(tmp_path))}\)$"):
        check_training(load_config(str(agent_config(tmp_path, command="python missing_agent.py", cwd=str(tmp_path)))))
    check_training(load_config(str(agent_config(tmp_path, command="python -m toolrl.no_such_module"))))
    with pytest.raises(ConfigError, match=r"rollout\.agent: cannot import 'not_a_module:run'"):
        check_training(load_config(str(agent_config(tmp_path, callable="not_a_module:run"))))


def test_a_context_policy_beside_an_agent_is_refused_and_tools_it_does_not_use_are_reported(tmp_path, capfd):
    """The program keeps its own context and calls its own tools: toolrl's loop does neither for it."""
    from toolrl.processes.prepare import check_training

    (tmp_path / "agent.py").write_text("")
    program = {"command": "python agent.py", "cwd": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"rollout\.agent: rollout\.context \(drop_tool_outputs\) edits toolrl's own loop"):
        context = {"name": "drop_tool_outputs", "trigger_tokens": 2000}
        check_training(load_config(str(agent_config(tmp_path, {"rollout": {"context": context}}, **program))))
    check_training(load_config(str(agent_config(tmp_path, {"tools": {"entries": []}}, **program))))
    assert "tools: not used, the agent program calls its own tools (rollout.agent)" in capfd.readouterr().err
