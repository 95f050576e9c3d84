"""The multi-turn episode (toolrl_bfcl.multi_turn) through the real rollout loop (pythonic parser, the
Qwen2.5 tokenizer and chat template) with a scripted engine standing in for the model: entries answered
with their own ground truth (BFCL's checker says 1), wrong, cut short or past the step limit (0);
miss_func's reveal; a backend that raises; calls that must run nothing; two episodes of one entry kept
apart, and BFCL's module globals left as they were; then ``toolrl eval`` and ``toolrl train`` whole."""

from __future__ import annotations

import ast
import inspect
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from toolrl.cli import cli
from toolrl.config import load_config
from toolrl.data.sources import load_samples
from toolrl.engines import CoreEngineOptions, Generation, SamplingParams
from toolrl.engines.transformers import TransformersEngine
from toolrl.plugins import get_plugins
from toolrl.plugins.registry import Part
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout import RolloutContext, run_rollouts
from toolrl.rollout.routes import build_routes
from toolrl.schemas import ToolCall
from toolrl.testing import ScriptedEngine
from toolrl.trajectory import Trajectory
from toolrl_bfcl import categories, upstream
from toolrl_bfcl.multi_turn import MultiTurnEpisode, build_backends, call_source, public_methods
from toolrl_bfcl.session import BfclSessionOptions

BASE = "multi_turn_base_1"  # GorillaFileSystem only, four turns
EVAL_IDS = ["multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2"]
DONE = "Done."


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """Qwen2.5's: its template is append-only at user turns (Qwen3's drops earlier turns' thinking)."""
    from toolrl.model_sources import qwen_tokenizer

    return qwen_tokenizer("qwen2_5")


def keyword_calls(entry_id: str, calls: list[str]) -> str:
    """Ground-truth call strings as one pythonic answer, positional arguments named from the backend's
    signature (the pythonic parser takes keywords only)."""
    methods = public_methods(build_backends(categories.entry(entry_id)))
    written = []
    for source in calls:
        tree = ast.parse(source, mode="eval").body
        assert isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name)
        names = list(inspect.signature(methods[tree.func.id]).parameters)
        arguments = {**{names[i]: ast.literal_eval(a) for i, a in enumerate(tree.args)},
                     **{k.arg: ast.literal_eval(k.value) for k in tree.keywords}}
        written.append(f"{tree.func.id}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})")
    return f"[{', '.join(written)}]"


def oracle_script(entry_id: str) -> list[str]:
    """Each user turn: its ground-truth calls in one model turn, then an answer (none where it has none)."""
    script: list[str] = []
    for calls in categories.entry(entry_id)["ground_truth"]:
        script += [keyword_calls(entry_id, calls), DONE] if calls else ["I cannot do that with these functions."]
    return script


async def rollout(tokenizer: Any, ids: list[str], scripts: dict[str, list[str]], category: str = "multi_turn_base",
                  n: int = 1, max_turns: int = 60, delay_s: float = 0.0, **env_options: Any) -> list[Trajectory]:
    """The entries' trajectories; ``scripts``: a piece of a trajectory id (``s0-g0-0``) → its texts."""
    config = load_config(None, data={
        "env": "bfcl", "env_options": {"test": [category], "ids": ids, **env_options},
        "rollout": {"max_turns": max_turns, "max_new_tokens": 1024, "max_response_tokens": 32768}})
    samples = load_samples(config, "test")
    routes, parts = await build_routes(config, samples)
    ctx = RolloutContext(engine=ScriptedEngine(tokenizer, scripts, delay_s=delay_s), config=config.rollout,
                         routes=routes, renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas))
    try:
        return await run_rollouts(ctx, samples, n=n, seed=0)
    finally:
        for part in parts:
            await part.close()


def verdict(traj: Trajectory) -> float:
    assert traj.error is None and traj.reward_errors == {}, (traj.error, traj.reward_errors)
    return traj.reward_terms["bfcl"]


def instance_globals() -> set[str]:
    return {n for n in vars(upstream.load().multi_turn_utils) if n.endswith("_instance")}


async def test_ground_truth_turn_by_turn_is_right_a_wrong_value_or_missing_turn_is_not(tokenizer: Any) -> None:
    script = oracle_script(BASE)
    wrong = [text.replace("destination='archive'", "destination='old'") for text in script]  # turn 2 moves elsewhere
    assert wrong != script
    right, wrong_value, looping, too_many_steps = await rollout(tokenizer, [BASE], {
        "s0-g0-0": script, "s0-g0-1": wrong, "s0-g0-2": script[:3],  # the last text repeats: turn 2's calls, forever
        "s0-g0-3": [script[0]] * 3 + script[1:]}, n=4, max_steps=2)
    assert verdict(right) == 1.0 and right.termination == "answered" and right.turns == 8
    assert [r.turn for r in right.tool_results] == [1, 3, 3, 5, 5, 7]  # a model turn per user turn's calls
    assert right.user_turns == [m["content"] for turn in categories.entry(BASE)["question"][1:] for m in turn]
    assert all(r.status == "ok" and r.metrics["bfcl.call"] == i for i, r in enumerate(right.tool_results))
    assert right.tool_results[0].response.text.startswith('{"current_directory_content": [')  # JSON, as BFCL
    assert verdict(wrong_value) == 0.0 and wrong_value.termination == "answered"
    # Past max_steps=2 model turns of calls in one user turn, BFCL force-terminates: fewer turns, wrong.
    assert verdict(looping) == 0.0 and len(looping.user_turns) == 1 and len(looping.tool_results) > 6
    assert verdict(too_many_steps) == 0.0 and [r.turn for r in too_many_steps.tool_results][:3] == [1, 2, 3]
    (same_right,) = await rollout(tokenizer, [BASE], {"s0-": [script[0]] * 3 + script[1:]}, max_steps=3)
    assert verdict(same_right) == 1.0  # ls three times changes nothing: within the limit it is right
    (stopped,) = await rollout(tokenizer, [BASE], {"s0-": script}, max_turns=5)
    assert stopped.termination == "max_turns" and verdict(stopped) == 0.0  # the rollout's limit: fewer turns


async def test_miss_func_reveals_the_held_out_function_at_its_turn(tokenizer: Any) -> None:
    entry_id = "multi_turn_miss_func_0"
    entry = categories.entry(entry_id)
    assert list(entry["missed_function"]) == ["3"] and entry["question"][3] == []
    sort = "[sort(file_name='final_report.pdf')]"
    truth = [keyword_calls(entry_id, calls) if calls else "" for calls in entry["ground_truth"]]
    # Turn 2 asks for a sort before sort exists (its ground truth: no call); turn 3 reveals it.
    script = [truth[0], DONE, truth[1], DONE, sort, "There is no function to sort a file.", sort, DONE, truth[4], DONE]
    (traj,) = await rollout(tokenizer, [entry_id], {"s0-": script}, category="multi_turn_miss_func")
    early, late = (r for r in traj.tool_results if r.name == "sort")
    assert early.status == "error" and early.response.text == "Error during execution: name 'sort' is not defined"
    assert late.status == "ok" and "bfcl.call" in late.metrics and "bfcl.call" not in early.metrics
    reveal = traj.user_turns[2]
    assert reveal.endswith("I have updated some more functions you can choose from. What about now?")
    assert "'name': 'sort'" in reveal and "'name': 'sort'" not in "".join(traj.user_turns[:2])
    assert verdict(traj) == 1.0
    # The system prompt (BFCL's) lists only the visible functions.
    (sample,) = load_samples(load_config(None, data={"env": "bfcl", "env_options": {
        "test": ["multi_turn_miss_func"], "ids": [entry_id]}}), "test")
    assert '"name": "sort"' not in sample.prompt[0].content and '"name": "mv"' in sample.prompt[0].content
    # Under native the chat template would show it from the start: refused.
    episode = MultiTurnEpisode(entry, "multi_turn_miss_func", BfclSessionOptions(format="native"), "t")
    with pytest.raises(ValueError, match="cannot run under format native"):
        await episode.reset()


async def test_a_backend_that_raises_is_an_error_the_model_reads(tokenizer: Any, monkeypatch) -> None:
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.gorilla_file_system import GorillaFileSystem

    def broken(self: Any) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(GorillaFileSystem, "pwd", broken)
    script = oracle_script(BASE)
    (traj,) = await rollout(tokenizer, [BASE], {"s0-": ["[pwd()]", *script]})
    assert traj.tool_results[0].status == "error"
    assert traj.tool_results[0].response.text == "Error during execution: disk on fire"
    assert traj.termination == "answered" and len(traj.user_turns) == 3 and traj.error is None
    assert verdict(traj) == 1.0  # the failed call changed nothing; the rest is the ground truth


async def test_nothing_the_model_writes_runs_as_code(tokenizer: Any, tmp_path: Path) -> None:
    marker = tmp_path / "bfcl_pwned"
    attacks = ["[_load_scenario(scenario={})]", "[__init__()]", "[__class__()]",
               f"[__import__('os').system('touch {marker}')]", f"[ls(a=__import__('os').system('touch {marker}'))]",
               f"[ls(a={{'open': {{'file': '{marker}', 'mode': 'w'}}}})]", DONE]
    (traj,) = await rollout(tokenizer, [BASE], {"s0-": attacks})
    assert traj.error is None and traj.termination == "answered" and not marker.exists()
    assert all(r.status != "ok" for r in traj.tool_results) and verdict(traj) == 0.0
    episode = MultiTurnEpisode(categories.entry(BASE), "multi_turn_base", BfclSessionOptions(), "t")
    await episode.reset()
    for name in ("_load_scenario", "__init__", "__class__", "__dict__", "_current_dir", "open", "eval", "nope"):
        result = await episode.step(ToolCall(name=name, arguments={"scenario": {}}))
        assert result.response.text == f"Error during execution: name '{name}' is not defined"
    injected = [{"a": {"open": {"file": str(marker), "mode": "w"}}},  # BFCL would write a nested call
                {f"a=__import__('os').system('touch {marker}'), b": 1},  # a key that is code
                {"a": {f"k': __import__('os').system('touch {marker}'), 'j": 1}}, {"a": float("nan")}]
    for arguments in injected:
        assert call_source("ls", arguments) is None
        result = await episode.step(ToolCall(name="ls", arguments=arguments))
        assert result.response.is_error and "plain literals" in result.response.text and not result.metrics
    assert episode.calls == [] and not marker.exists()
    episode.close()
    assert episode.backends == {} and episode.methods == {}


async def test_arithmetic_is_bounded_and_leaves_the_process_precision_alone() -> None:
    import decimal

    import mpmath

    episode = MultiTurnEpisode(categories.entry("multi_turn_base_15"), "multi_turn_base", BfclSessionOptions(), "t")
    await episode.reset()
    dps, prec = mpmath.mp.dps, decimal.getcontext().prec
    logarithm = await episode.step(ToolCall(name="logarithm", arguments={"value": 20, "base": 10, "precision": 4}))
    root = await episode.step(ToolCall(name="square_root", arguments={"number": 2, "precision": 30}))
    assert "1.301" in logarithm.response and "1.41421356237309504880168872421" in root.response
    assert (mpmath.mp.dps, decimal.getcontext().prec) == (dps, prec)  # MathAPI set both: restored
    for name, arguments in [("logarithm", {"value": 2, "base": 10, "precision": 10**6}),
                            ("square_root", {"number": 2, "precision": 10**7}),
                            ("power", {"base": 10, "exponent": 10**9})]:
        refused = await episode.step(ToolCall(name=name, arguments=arguments))  # minutes of arithmetic: not run
        assert refused.response.is_error and "must be at most" in refused.response.text and not refused.metrics
    huge = await episode.step(ToolCall(name="power", arguments={"base": 10**10, "exponent": 1000}))
    assert huge.response.is_error and huge.response.text.startswith("Error during execution: Exceeds the limit")
    assert len(episode.calls) == 3  # the two results and the huge one ran; the refused did not


async def test_two_episodes_of_one_entry_keep_apart_and_leave_no_globals(tokenizer: Any) -> None:
    entry = categories.entry(BASE)
    before = instance_globals()
    one, two = (MultiTurnEpisode(entry, "multi_turn_base", BfclSessionOptions(), t) for t in ("a", "b"))
    for episode in (one, two):
        await episode.reset()
    await one.step(ToolCall(name="mkdir", arguments={"dir_name": "mine"}))
    listed = [(await e.step(ToolCall(name="ls", arguments={}))).response for e in (two, one)]
    assert "mine" not in listed[0] and "mine" in listed[1]
    assert one.backends["GorillaFileSystem"] is not two.backends["GorillaFileSystem"]
    for episode in (one, two):
        episode.close()
    # Interleaved through the loop (the engine waits before each turn, so the two take turns): one makes a
    # directory in its first turn, the other looks in its second and does not see it; each is scored on
    # its own calls.
    script = oracle_script(BASE)
    right, extra = await rollout(tokenizer, [BASE], {"s0-g0-0": ["[pwd()]", *script],
                                                     "s0-g0-1": ["[mkdir(dir_name='x')]", *script]}, n=2, delay_s=0.01)
    assert right.tool_results[1].name == "ls" and right.tool_results[1].turn == 2
    assert '"x"' not in right.tool_results[1].response.text and '"x"' in extra.tool_results[1].response.text
    assert verdict(right) == 1.0 and verdict(extra) == 0.0
    assert instance_globals() == before


class OracleEngine(ScriptedEngine):
    """``scripted`` with each entry's own oracle script, chosen by sample index (the registered engine
    takes one script for every trajectory)."""

    name = "bfcl-oracle"
    Options = CoreEngineOptions
    scripts: dict[str, list[str]] = {}

    @classmethod
    def create(cls, source: Any, config: Any) -> OracleEngine:
        return cls(source.tokenizer, cls.scripts, record=False)


def test_toolrl_eval_reports_bfcl_figures(tmp_path: Path) -> None:
    registry = get_plugins().registry
    if not registry.has("rollout_engines", OracleEngine.name):
        registry.add(Part("rollout_engines", OracleEngine.name, "tests", OracleEngine))
    OracleEngine.scripts = {f"s{i}-g": oracle_script(entry_id) for i, entry_id in enumerate(EVAL_IDS)}
    config = tmp_path / "eval.yaml"
    config.write_text(f"model: {{source: tiny-qwen3, tokenizer: qwen2_5}}\nenv: bfcl\n"
                      f"env_options: {{test: [multi_turn_base], ids: {json.dumps(EVAL_IDS)}}}\n"
                      f"engine: {{name: {OracleEngine.name}}}\n"
                      "rollout: {max_turns: 60, max_new_tokens: 1024, max_response_tokens: 32768}\n")
    out = tmp_path / "eval"
    result = CliRunner().invoke(cli, ["eval", str(config), "--output", str(out)])
    assert result.exit_code == 0, result.output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_trajectories"] == 3
    report = summary["reports"]["bfcl"]
    assert report["multi_turn_base"] == 100.0 and report["summary/multi_turn"] == 25.0  # 1 of 4 categories run
    assert "bfcl: its own figures" in result.output


class OracleModel(TransformersEngine):
    """The tiny random model runs each turn (one token, discarded: BFCL reads an answer that is the call list
    alone), and the entry's oracle text is the turn (in the trajectory as the model's, logprob 0, as the
    lookup plugin's learning test does), so training takes the whole multi-turn path: calls, results, user
    turns, BFCL's verdict as the reward."""

    name = "bfcl-oracle-model"
    scripts: dict[str, list[str]] = {}
    turns: dict[str, int] = {}

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1, session_id: str | None = None,
                       images: Any = (), adapter: str | None = None) -> list[Generation]:
        free = replace(params, max_new_tokens=1, stop_strings=[], stop_token_ids=[])
        generations = await super().generate(prompt_ids, free, n, session_id)
        turn = self.turns[session_id or ""] = self.turns.get(session_id or "", -1) + 1
        texts = next(t for key, t in self.scripts.items() if key in (session_id or ""))
        eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        ids = self.tokenizer.encode(texts[min(turn, len(texts) - 1)], add_special_tokens=False) + [eos]
        return [replace(g, token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop", stop=eos)
                for g in generations]


@pytest.mark.timeout(900)
def test_toolrl_train_runs_two_steps(tmp_path: Path) -> None:
    registry = get_plugins().registry
    if not registry.has("rollout_engines", OracleModel.name):
        registry.add(Part("rollout_engines", OracleModel.name, "tests", OracleModel))
    ids = [BASE]  # the shortest prompt (one backend's functions): both steps train on it
    OracleModel.scripts, OracleModel.turns = {f"s{i}-g": oracle_script(entry_id) for i, entry_id in enumerate(ids)}, {}
    config = tmp_path / "train.yaml"
    config.write_text(f"model: {{source: tiny-qwen3, tokenizer: qwen2_5}}\nenv: bfcl\n"
                      f"env_options: {{train: [multi_turn_base], test: [multi_turn_base], ids: {json.dumps(ids)}}}\n"
                      f"engine: {{name: {OracleModel.name}}}\ndata: {{batch_size: 1}}\n"
                      "rollout: {n: 2, max_turns: 20, max_new_tokens: 256, max_response_tokens: 8192}\n"
                      "optim: {micro_batch_size: 2}\n"
                      f"trainer: {{total_steps: 2, output_dir: {tmp_path / 'run'}, plot: false, progress: false, "
                      "save_every: 100}\n")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = CliRunner().invoke(cli, ["train", str(config)])
    assert result.exit_code == 0, result.output[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward_mean"] for r in rows if "reward_mean" in r] == [1.0, 1.0]
    traces = [json.loads(line) for step in (1, 2)
              for line in (tmp_path / "run" / "rollouts" / f"step_{step:05d}.jsonl").read_text().splitlines()]
    assert len(traces) == 4 and all(t["termination"] == "answered" and len(t["user_turns"]) >= 3 for t in traces)
