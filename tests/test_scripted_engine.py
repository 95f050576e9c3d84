"""The built-in ``scripted`` engine drives an environment session with fixed calls, from the YAML file
in docs/environments.md and the ``counter`` session in docs/plugins.md, both read from the markdown
(so the docs and this test cannot drift apart), through the real ``toolrl rollout`` command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _dists import make_dist
from toolrl.config import ConfigError
from toolrl.plugins import get_plugins
from toolrl.plugins.parts import checked_options, lookup_part
from toolrl.testing.scripted_engine import ScriptedEngine

DOCS = Path(__file__).resolve().parents[1] / "docs"


def fenced(markdown: str, language: str, holding: str) -> str:
    """The one ``language`` code block of ``markdown`` that holds ``holding``."""
    blocks = [b for b in re.findall(rf"^```{language}\n(.*?)^```$", markdown, re.S | re.M) if holding in b]
    assert len(blocks) == 1, f"{len(blocks)} {language} blocks hold {holding!r}"
    return blocks[0]


def test_scripted_is_a_registered_engine() -> None:
    assert lookup_part("rollout_engines", "scripted", "engine.name") is ScriptedEngine
    info = {i.name: i for i in get_plugins().list()}["scripted"]
    assert info.builtin and info.hooks == ["register_rollout_engines"]


@pytest.mark.slow  # a toolrl rollout: ~2 s in process, ~35 s as a process of its own under load
def test_the_docs_yaml_drives_the_counter_session_with_fixed_calls(tmp_path: Path, monkeypatch,
                                                                    toolrl_reload_plugins) -> None:
    from click.testing import CliRunner
    from toolrl.cli import cli

    config = fenced((DOCS / "environments.md").read_text(), "yaml", "name: scripted")
    session = fenced((DOCS / "plugins.md").read_text(), "python", "class Counter(EnvironmentSession)")
    make_dist(tmp_path, "toolrl-plugin-counter", "counter", "toolrl_counter", session)
    (tmp_path / "counter-scripted.yaml").write_text(config)
    # `toolrl rollout` in this process (click's runner), the counter plugin discovered by its entry point as
    # in a fresh one: the same command, without an interpreter's start.
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    toolrl_reload_plugins()
    done = CliRunner().invoke(cli, ["rollout", "counter-scripted.yaml"])
    assert done.exit_code == 0 and done.exception is None, (done.exception, done.stderr[-3000:])
    traces = [json.loads(line) for line in
              (tmp_path / "runs/counter-scripted/rollouts/step_00001.jsonl").read_text().splitlines()]
    assert len(traces) == 2
    for trace in traces:
        assert trace["termination"] == "done", trace.get("error")
        assert [(r["name"], r["response"]["text"]) for r in trace["tool_results"]] == [("add", "2"), ("add", "5")]
        assert trace["reward_terms"]["counter"] == 1.0
        assert "The count is 5." not in trace["response_text"]  # the session ended the trajectory first


@pytest.mark.parametrize(("options", "error"), [
    ({}, "engine.options.script: Field required"), ({"script": []}, "engine.options.script"),
    ({"script": ["hi"], "temperature": 1.0}, "engine.options.temperature: unknown key")])
def test_bad_scripted_options_are_one_config_error(options: dict, error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        checked_options(ScriptedEngine, options, "engine.options")
    assert str(caught.value).startswith(error) and "\n" not in str(caught.value)


async def test_a_script_ends_as_a_model_would() -> None:
    """At the end-of-turn token; at a parser's stop string (an inline call runs); cut at max_new_tokens."""
    from toolrl.engines import SamplingParams
    from toolrl.model_sources import qwen_tokenizer

    tokenizer = qwen_tokenizer("qwen3")
    engine = ScriptedEngine(tokenizer, ["hello", "<calculator>1+2</calculator>", "word " * 40])
    params = SamplingParams(max_new_tokens=16, stop_token_ids=[7], stop_strings=["</calculator>"])
    first, second, third, fourth = [(await engine.generate([1], params, session_id="a"))[0] for _ in range(4)]
    assert first.token_ids == [*tokenizer.encode("hello", add_special_tokens=False), 7]
    assert (first.finish_reason, second.finish_reason, third.finish_reason) == ("stop", "stop_string", "length")
    assert len(third.token_ids) == 16 and fourth.token_ids == third.token_ids  # the last text repeats
    assert (await engine.generate([1], params, session_id="b"))[0].token_ids == first.token_ids  # per trajectory
    assert "no weights" in await engine.check_trainable()  # training refuses it in one line


async def test_a_configs_script_may_give_each_trajectory_its_own_texts(tmp_path: Path) -> None:
    """``script`` as a mapping from a piece of a session id to its trajectory's texts: the config validates,
    and each trajectory replays its own texts (the key its id contains: ``s<problem>-``)."""
    from toolrl.config import load_config
    from toolrl.data.sources import load_samples
    from toolrl.model_sources import load_tokenizer, model_path
    from toolrl.processes.in_process import build_rollouts

    (tmp_path / "questions.jsonl").write_text("".join(json.dumps({"prompt": f"Question {i}?"}) + "\n" for i in range(2)))
    (tmp_path / "scripted.yaml").write_text(
        "model: {source: tiny-qwen3}\ndata: {train_files: [questions.jsonl]}\n"
        "engine:\n  name: scripted\n  options:\n    script:\n      s0-: [First answer.]\n      s1-: [Second answer.]\n")
    config = load_config(str(tmp_path / "scripted.yaml"))
    assert checked_options(ScriptedEngine, config.engine.options, "engine.options").script == {  # type: ignore[attr-defined]
        "s0-": ["First answer."], "s1-": ["Second answer."]}
    samples = load_samples(config)
    path = model_path(config)
    rollouts = await build_rollouts(config, path, load_tokenizer(path), samples=samples)
    try:
        first, second = await rollouts.run(samples, n=1, seed=0)
    finally:
        await rollouts.close()
    assert first.final_response.startswith("First answer.") and second.final_response.startswith("Second answer.")
