"""The ``textworld`` environment and session: games generated once (one child, PYTHONHASHSEED=0, the same
game from the same seed) and cached; held-out games never in the training split; bad options refused
in one line before anything loads; a game's views, rewards, state keys and clones; an engine that
fails ends its trajectory as an infrastructure error; and, through the real rollout loop with a
scripted engine standing in for the model, a group of games whose turns start from shared states."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from toolrl import InfrastructureError
from toolrl.cli import cli
from toolrl.config import load_config
from toolrl.data.sources import load_samples, load_split
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout import RolloutContext, run_rollouts
from toolrl.rollout.routes import build_routes
from toolrl.schemas import Sample, ToolCall
from toolrl.sessions import SessionKind
from toolrl.testing import ScriptedEngine, listing_imports
from toolrl_textworld.environment import EXAMPLE_SEED, TEXTWORLD
from toolrl_textworld.games import GameSpec, GenerationError, digest, ensure
from toolrl_textworld.headline import headline
from toolrl_textworld.session import Play, TextworldSessionOptions

SMALL = {"rooms": 2, "objects": 1, "quest_length": 2, "train_size": 3, "test_size": 2}


def split(options: dict, name: str) -> list[Sample]:
    env, validated = TEXTWORLD.resolve(options)
    return load_split(env, name, validated)


def test_held_out_games_are_never_trained_on_and_splits_are_seeded() -> None:
    train, test = split(SMALL, "train"), split(SMALL, "test")
    paths = {s.index: GameSpec(**s.extra_info["game"]).path() for s in train}
    held = {digest(GameSpec(**s.extra_info["game"]).path()) for s in test}
    assert len(test) == 2 and train and not {digest(p) for p in paths.values()} & held
    assert [s.extra_info for s in split(SMALL, "train")] == [s.extra_info for s in train]  # the same draws again
    assert [s.extra_info for s in split({**SMALL, "seed": 1}, "train")] != [s.extra_info for s in train]
    first = train[0].prompt[0].content
    assert "-= " in first and "Commands:\n1. " in first  # the objective, the first view, the numbered menu


def test_a_game_is_generated_once_and_the_same_from_the_same_seed(tmp_path: Path) -> None:
    spec = GameSpec(rooms=2, objects=1, quest_length=2, seed=11)
    (path,) = ensure([spec])
    made = path.stat().st_mtime_ns
    assert ensure([spec]) == [path] and path.stat().st_mtime_ns == made  # cached: never generated again
    # Another process, another cache: the same game (the child runs with PYTHONHASHSEED=0, whatever ours is).
    code = ("from toolrl_textworld.games import GameSpec, ensure, digest; "
            f"print(digest(ensure([GameSpec(**{spec.model_dump()!r})])[0]))")
    env = {**os.environ, "TOOLRL_TEXTWORLD_CACHE": str(tmp_path), "PYTHONHASHSEED": "123"}
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert again.stdout.strip() == digest(path)


def test_a_spec_the_child_refuses_names_the_game() -> None:
    """A spec built past validation (``model_construct``) is refused in the child, by name, not by a crash."""
    bad = GameSpec.model_construct(kind="treasure_hunter", rooms=2, objects=2, quest_length=2, level=31, seed=1)
    with pytest.raises(GenerationError, match=r"the game treasure_hunter level=31 seed=1: ValidationError: "):
        ensure([bad])


@pytest.mark.parametrize(("options", "error"), [
    ("{kind: zork}", "env_options: kind 'zork' is not a TextWorld game kind here: custom, treasure_hunter"),
    ("{kind: cooking}", "env_options: kind 'cooking': its generator replays the walkthrough on the compiled z-machine"),
    ("{kind: treasure_hunter, rooms: 3}", "env_options: rooms: treasure_hunter games have no such knob (level)"),
    ("{levels: {level: [1, 2]}}", "env_options: levels: one knob of custom games (rooms, objects, quest_length)"),
    ("{quest_length: 12, max_steps: 8}", "env_options: quest of 12 commands is longer than max_steps=8 allows"),
    ("{kind: treasure_hunter, level: 25, max_steps: 10}", "env_options: quest of 11 commands is longer than max_steps=10"),
    ("{commands: none}", "env_options: answer: number picks from the commands listed: commands must be all or actions"),
])
def test_bad_options_are_one_line_before_anything_loads(tmp_path: Path, options: str, error: str) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(f"model: {{source: tiny-qwen3}}\nenv: textworld\nenv_options: {options}\n"
                    f"trainer: {{output_dir: {tmp_path / 'run'}}}\n")
    result = CliRunner().invoke(cli, ["train", str(path), "--check"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr
    assert error in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_each_answer_form_gets_its_parser() -> None:
    """A number or a typed command is the turn's text (textworld_command); an act call is read in the model
    family's tool-call format, with no worked game (the chat template shows the tool)."""
    for answer, parser in (("number", "textworld_command"), ("text", "textworld_command"), ("tool", "hermes")):
        env, _ = TEXTWORLD.resolve({**SMALL, "answer": answer})
        assert env.parser == parser and bool(env.prompt_prefix) == (answer != "tool"), answer


def test_levels_are_one_knob_s_values() -> None:
    options = {**SMALL, "levels": {"quest_length": [1, 3]}}
    env, _ = TEXTWORLD.resolve(options)
    assert env.levels == ["quest_length=1", "quest_length=3"]
    test = split(options, "test")
    assert [s.level for s in test] == [0, 0, 1, 1]
    assert [s.extra_info["quest"] for s in test] == [1, 1, 3, 3]


def play(spec: GameSpec, **options: Any) -> Play:
    (path,) = ensure([spec])
    return Play(str(path), TextworldSessionOptions(**options))


def test_views_rewards_and_the_end_of_a_game() -> None:
    game = play(GameSpec(rooms=2, objects=1, quest_length=2, seed=7), answer="text")
    opening = game.opening()
    assert opening.startswith(game.state["objective"]) and "You carry" in opening and "Commands: " in opening
    reply, reward, done = game.act("dance")
    assert reply.startswith("You cannot 'dance' here.") and reward is None and not done
    rewards = []
    for command in list(game.state["policy_commands"]):
        reply, reward, done = game.act(command.upper())  # typed commands are read case- and space-blind
        rewards.append(reward)
    assert done and game.state["won"] and reply.endswith("*** You won! ***") and "Commands" not in reply
    assert sum(rewards) == pytest.approx(1.0) and rewards[-1] == pytest.approx(1.0)  # custom games: one point


def test_progress_rewards_each_step_along_the_winning_policy() -> None:
    game = play(GameSpec(rooms=3, objects=2, quest_length=3, seed=4), answer="text", reward="progress")
    rewards = [game.act(c)[1] for c in list(game.state["policy_commands"])]
    assert rewards == pytest.approx([1 / 3] * 3)


def test_numbers_pick_listed_commands() -> None:
    game = play(GameSpec(rooms=2, objects=1, quest_length=2, seed=7))
    listed = game.state["admissible_commands"]
    assert game.command("2") == listed[1] and game.command(" 2. ") == listed[1] and game.command(listed[0]) == listed[0]
    reply, reward, _ = game.act("99")
    assert reply.startswith(f"There is no command '99': answer with the number of one of the {len(listed)} commands")
    assert reward is None and "\n1. " in reply  # the menu again


def test_the_actions_menu_lists_what_can_change_the_state_and_numbers_it() -> None:
    game = play(GameSpec(rooms=2, objects=1, quest_length=2, seed=7), commands="actions")
    listed = game.listed()
    assert listed and not any(c in ("look", "inventory") or c.startswith("examine ") for c in listed)
    assert set(listed) < set(game.state["admissible_commands"]) and "look" in game.state["admissible_commands"]
    assert game.opening().endswith("\n".join(f"{i}. {c}" for i, c in enumerate(listed, 1)))
    for command in list(game.state["policy_commands"]):  # the walkthrough by the numbers of this menu
        reply, _, done = game.act(str(game.listed().index(command) + 1))
    assert done and game.state["won"]


def test_a_shuffled_menu_is_the_same_commands_in_an_order_the_state_fixes() -> None:
    specs = [GameSpec(rooms=2, objects=2, quest_length=2, seed=s) for s in (7, 8, 9)]
    moved = 0
    for spec in specs:
        game, twin = play(spec, commands="actions", order="shuffled"), play(spec, commands="actions", order="shuffled")
        plain = play(spec, commands="actions")
        assert sorted(game.listed()) == plain.listed() and twin.listed() == game.listed()  # same state, same menu
        for command in list(game.state["policy_commands"]):  # the walkthrough by this menu's numbers
            moved += game.listed() != sorted(game.listed())
            reply, _, done = game.act(str(game.listed().index(command) + 1))
        assert done and game.state["won"], spec
    assert moved  # a place no longer tells the verb


async def session_for(spec: GameSpec, **options: Any) -> Any:
    kind = SessionKind.resolve("textworld", options, ".")
    session = kind.cls(kind.options, kind.context("t-0"))
    await session.reset(Sample(prompt="p", extra_info={"game": spec.model_dump()}))
    return session


async def test_state_keys_are_the_state_and_clones_play_apart() -> None:
    spec = GameSpec(rooms=2, objects=1, quest_length=2, seed=7)
    a, b = await session_for(spec, answer="text"), await session_for(spec, answer="text")
    start = await a.state_key()
    assert start == await b.state_key() and "Commands" not in start
    a.step(ToolCall(name="act", arguments={"command": "look"}))  # looking changes nothing: the same state
    assert await a.state_key() == start
    walk = list(a.play.state["policy_commands"])
    twin = await a.clone()
    twin.step(ToolCall(name="act", arguments={"command": walk[0]}))
    assert await twin.state_key() != start and await a.state_key() == start
    b.step(ToolCall(name="act", arguments={"command": walk[0]}))
    assert await b.state_key() == await twin.state_key()  # another path into the same state: the same key
    for command in walk[1:]:
        result = twin.step(ToolCall(name="act", arguments={"command": command}))
    assert result.done and await twin.score(None) == 1.0 and await a.score(None) == 0.0


async def test_an_engine_that_fails_is_an_infrastructure_error(monkeypatch: pytest.MonkeyPatch) -> None:
    session = await session_for(GameSpec(rooms=2, objects=1, quest_length=2, seed=7), answer="text")

    def broken(command: str) -> Any:
        raise RuntimeError("engine state lost")

    monkeypatch.setattr(session.play.env, "step", broken)
    command = session.play.state["policy_commands"][0]
    with pytest.raises(InfrastructureError, match=f"TextWorld's engine failed on '{command}': RuntimeError"):
        session.step(ToolCall(name="act", arguments={"command": command}))


def test_listing_the_plugins_imports_neither_textworld_nor_the_plugin_s_modules() -> None:
    printed, modules = listing_imports("toolrl_textworld", "textworld", "jericho")
    assert modules == ["toolrl_textworld"] and "toolrl-plugin-textworld" in printed


def test_textworld_imports_without_jericho() -> None:
    """TextWorld's package imports jericho; the plugin stands in for it (a C build it never runs)."""
    code = ("import importlib.util, sys; assert importlib.util.find_spec('jericho') is None; "
            "from toolrl_textworld.upstream import load; load(); import jericho\n"
            "try:\n    jericho.FrotzEnv\nexcept AttributeError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "jericho is not installed" in out


async def test_a_group_of_games_through_the_rollout_loop(qwen3_tokenizer: Any) -> None:
    config = load_config(None, data={"env": "textworld", "env_options": {**SMALL, "example": False},
                                     "rollout": {"max_response_tokens": 8192}})
    sample = load_samples(config, "test")[0]
    spec = GameSpec(**sample.extra_info["game"])
    numbers = []
    game = play(spec)
    for command in game.state["policy_commands"]:
        numbers.append(str(game.state["admissible_commands"].index(command) + 1))
        game.act(numbers[-1])
    scripts = {"g0-0": [f"{n}\n" for n in numbers], "g0-1": ["look\n", *[f"{n}\n" for n in numbers]],
               "g0-2": ["99\n"] * 30}
    routes, parts = await build_routes(config, [sample])
    ctx = RolloutContext(engine=ScriptedEngine(qwen3_tokenizer, scripts), config=config.rollout, routes=routes,
                         renderer_factory=lambda schemas: ChatRenderer(qwen3_tokenizer, schemas))
    try:
        won, detour, lost = await run_rollouts(ctx, [sample], n=3, seed=0)
    finally:
        for part in parts:
            await part.close()
    assert (won.termination, won.turns) == ("done", len(numbers)) and won.reward == pytest.approx(2.0)
    assert (detour.termination, detour.turns) == ("done", len(numbers) + 1)
    assert (lost.termination, lost.turns, lost.reward) == ("max_turns", 20, 0.0)
    # "look" leaves the state as it was: the detour's first two turns start from the same state as won's first
    assert detour.turn_states[0] == detour.turn_states[1] == won.turn_states[0] == lost.turn_states[0]


async def test_a_long_game_under_a_context_policy(qwen3_tokenizer: Any) -> None:
    """A game wandered for all its turns under ``rollout.context: window``: the context is cut into segments
    (each a trajectory piece), the game goes on in the same session, and the task (system prompt, the
    game's opening) stays in every piece."""
    config = load_config(None, data={"env": "textworld", "env_options": {**SMALL, "example": False, "max_steps": 12},
                                     "rollout": {"max_response_tokens": 8192,
                                                 "context": {"name": "window", "trigger_tokens": 600, "keep_turns": 2}}})
    sample = load_samples(config, "test")[0]
    routes, parts = await build_routes(config, [sample])
    ctx = RolloutContext(engine=ScriptedEngine(qwen3_tokenizer, {"g0-0": ["look\n"] * 12}), config=config.rollout,
                         routes=routes, renderer_factory=lambda schemas: ChatRenderer(qwen3_tokenizer, schemas))
    try:
        pieces = await run_rollouts(ctx, [sample], n=1, seed=0)
    finally:
        for part in parts:
            await part.close()
    assert len(pieces) > 1 and pieces[-1].termination == "max_turns"
    assert sum(p.turns for p in pieces) == 12
    opening = sample.prompt[0].content.split("\n")[0]
    assert all(opening in qwen3_tokenizer.decode(p.prompt_ids) for p in pieces)


def _evaluation(directory: Path, temperature: float, n: int, wins: list[bool]) -> str:
    directory.mkdir()
    (directory / "summary.json").write_text(json.dumps({"temperature": temperature, "n": n}))
    (directory / "results.jsonl").write_text("".join(
        json.dumps({"env": "textworld", "reward_terms": {"textworld": 1.0 if w else 0.0}}) + "\n" for w in wins))
    return str(directory)


def test_the_headline_counts_plays_won_and_says_how_they_were_played(tmp_path: Path) -> None:
    before = _evaluation(tmp_path / "before", 1.0, 2, [True, False, False, False])
    after = _evaluation(tmp_path / "after", 1.0, 2, [True, True, False, True])
    assert headline(before, after) == ("TextWorld held-out games won, sampled at temperature 1, 2 plays a game: "
                                       "before 1/4 → after 3/4")
    greedy = _evaluation(tmp_path / "greedy", 0.0, 1, [True, False])
    assert headline(greedy, greedy) == "TextWorld held-out games won, greedy: before 1/2 → after 1/2"
    with pytest.raises(SystemExit, match="played alike"):
        headline(greedy, after)


def test_env_list_generates_no_split(tmp_path: Path) -> None:
    """Listed unsized (the environment's ``sized``): only the worked example's game is made, by its options."""
    out = CliRunner().invoke(cli, ["env", "list", "--json"], env={"TOOLRL_TEXTWORLD_CACHE": str(tmp_path)})
    assert out.exit_code == 0, out.output
    listed = {r["name"]: r for r in json.loads(out.output)}
    assert {s["size"] for s in listed["textworld"]["splits"].values()} == {None}
    assert [p.name for p in tmp_path.iterdir()] == [GameSpec(seed=EXAMPLE_SEED).path().name]


def test_the_curriculum_benchmark_counts_kept_rollouts_by_the_levels_of_its_training_split(tmp_path: Path) -> None:
    """``benchmarks/textworld_claims.py --rollouts DIR --claim curriculum``: the claim's training split is loaded
    (one game a level here) and each step's groups counted by their games' levels, a group once however many
    plays it holds."""
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    for step, indices in ((1, [0, 1, 2, 3]), (2, [0, 0, 3])):
        rows = [{"group": g, "sample_index": i, "response_mask": [1], "turn_starts": [0], "advantage": 0.0}
                for g, i in enumerate(indices) for _ in range(2)]
        (rollouts / f"step_{step:05d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench = Path(__file__).resolve().parents[3] / "benchmarks" / "textworld_claims.py"
    done = subprocess.run([sys.executable, str(bench), "--rollouts", str(rollouts), "--claim", "curriculum",
                           "--train", "1", "--held-out", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{rollouts}: games trained by level a step 1/1/1/1 2/0/0/1"]
