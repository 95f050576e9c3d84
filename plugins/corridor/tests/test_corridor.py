"""The ``corridor`` environment: disjoint seeded splits and its turn budget; the session's moves, state
keys and reward (only at the exit, never per step); clones that go on apart; and, through the real
rollout loop (tags parser, Qwen3 tokenizer and chat template) with a scripted engine standing in for
the model, a group whose trajectories start turns from the same rooms (``gigpo``'s anchor states):
a straight walk, a detour that still gets out, and one that runs out of turns."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from toolrl.cli import cli
from toolrl.config import ConfigError, load_config
from toolrl.data.sources import load_samples, load_split
from toolrl.plugins import get_plugins
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout import RolloutContext, run_rollouts
from toolrl.rollout.routes import build_routes
from toolrl.schemas import Sample, ToolCall
from toolrl.sessions import SessionKind
from toolrl.testing import ScriptedEngine
from toolrl_corridor.environment import CORRIDOR, DOORS_PROMPT, SYSTEM_PROMPT, TAG_ROUTES, held_out
from toolrl_corridor.session import CorridorSession


def split(options: dict, name: str) -> list[Sample]:
    env, validated = CORRIDOR.resolve(options)
    return load_split(env, name, validated)


def test_splits_are_disjoint_seeded_and_budgeted() -> None:
    options = {"rooms": 4, "train_size": 200, "test_size": 40}
    train, test = split(options, "train"), split(options, "test")
    corridors = [tuple(s.extra_info["rooms"]) for s in train], [tuple(s.extra_info["rooms"]) for s in test]
    assert set(corridors[0]).isdisjoint(corridors[1]) and len(set(corridors[1])) == 40 and len(corridors[0]) == 200
    assert all(held_out(list(c)) for c in corridors[1]) and not any(held_out(list(c)) for c in corridors[0])
    for s in train + test:
        rooms = s.extra_info["rooms"]
        assert len(rooms) == len(set(rooms)) == 4 and f"in the {rooms[0]}, the first of 4" in s.prompt[0].content
    assert [s.prompt for s in split({**options, "seed": 1}, "train")] != [s.prompt for s in train]
    assert CORRIDOR.resolve({"rooms": 6})[0].max_turns == 12
    assert CORRIDOR.resolve({"rooms": 6, "turns_per_room": 3})[0].max_turns == 18
    with pytest.raises(ConfigError, match="rooms"):
        CORRIDOR.resolve({"rooms": 1})
    plain, shown_walk = (load_samples(load_config(None, data={"env": "corridor", "env_options": {"example": e}}))[0]
                         for e in (False, True))
    assert [m.role for m in plain.prompt] == ["system", "user"]
    assert [m.role for m in shown_walk.prompt] == ["system", "user", "assistant", "user"]
    walked = get_plugins().load_part("tool_parsers", "tags")(**TAG_ROUTES).parse(shown_walk.prompt[2].content)
    assert [c.arguments for c in walked.calls] == [{"direction": "east"}] * 3  # a 3-room walk, as the parser reads it
    assert shown_walk.prompt[2].content.endswith("```output\nYou walk out through the exit.\n```")
    shown = CliRunner().invoke(cli, ["env", "show", "corridor"])
    assert shown.exit_code == 0 and "  session: corridor\n" in shown.output, shown.output


def test_a_misspelt_option_names_its_line_and_the_option_meant(tmp_path) -> None:
    """``toolrl train --check``: one line, the option's own line, the closest option (issue 85)."""
    path = tmp_path / "cfg.yaml"
    path.write_text(f"model: {{source: tiny-qwen3}}\nenv: corridor\nenv_options:\n  train_size: 4\n  roms: 3\n"
                    f"trainer: {{output_dir: {tmp_path / 'run'}}}\n")
    result = CliRunner().invoke(cli, ["train", str(path), "--check"])
    assert result.exit_code == 2 and result.stderr == (f"error: {path}:5: env_options.roms: unknown key (did you mean "
                                                       "'rooms'?)\n"), result.stderr
    assert not (tmp_path / "run").exists()


def test_doors_differ_by_room_seeded() -> None:
    options = {"rooms": 5, "train_size": 64, "test_size": 16}
    plain = split(options, "train")
    assert all(s.extra_info["doors"] == ["east"] * 5 for s in plain)
    assert CORRIDOR.resolve(options)[0].system_prompt == SYSTEM_PROMPT
    alternate = split({**options, "doors": "alternate"}, "train")
    assert [s.extra_info["rooms"] for s in alternate] == [s.extra_info["rooms"] for s in plain]  # the same corridors
    assert all(s.extra_info["doors"] == ["east", "west", "east", "west", "east"] for s in alternate)
    assert all(s.prompt[0].content.endswith(f"The exit is through the {s.extra_info['rooms'][-1]}'s door on.")
               for s in alternate)
    assert CORRIDOR.resolve({"doors": "alternate"})[0].system_prompt == DOORS_PROMPT

    def plan(seed: int) -> dict[str, str]:
        """Each room name's door, checked the same in every corridor of both splits."""
        doors: dict[str, str] = {}
        for name in ("train", "test"):
            for s in split({**options, "doors": "random", "seed": seed}, name):
                for room, door in zip(s.extra_info["rooms"], s.extra_info["doors"], strict=True):
                    assert doors.setdefault(room, door) == door, room
        return doors

    first = plan(0)
    assert set(first.values()) == {"east", "west"} and len(first) > 20
    assert plan(0) == first and plan(1) != first  # seeded: stable, and another seed draws another plan
    with pytest.raises(ConfigError, match="doors"):
        CORRIDOR.resolve({"doors": "north"})
    example = CORRIDOR.resolve({"doors": "alternate", "example": True})[0].prompt_prefix[1]["content"]
    walked = get_plugins().load_part("tool_parsers", "tags")(**TAG_ROUTES).parse(example)
    assert [c.arguments["direction"] for c in walked.calls] == ["east", "west", "east"]  # the example's doors on


async def walk(moves: list[str], rooms: int = 3, doors: list[str] | None = None,
               **options: Any) -> tuple[CorridorSession, list[str], list[Any]]:
    """The session after ``moves``: the state key before each move and each step's result."""
    kind = SessionKind.resolve("corridor", options, ".")
    session = kind.cls(kind.options, kind.context("t-0"))
    extra = {"rooms": [f"r{i}" for i in range(rooms)], **({"doors": doors} if doors else {})}
    await session.reset(Sample(prompt="p", extra_info=extra))
    keys, results = [], []
    for direction in moves:
        keys.append(await session.state_key())
        results.append(session.step(ToolCall(name="move", arguments={"direction": direction})))
    return session, keys, results


async def test_moves_keys_and_the_reward_only_at_the_exit() -> None:
    session, keys, results = await walk(["west", "east", "west", "east", "east", "sideways", "east"])
    # a wall, a step back and an unknown door cost a turn each and never end the walk
    assert keys == ["room 0", "room 0", "room 1", "room 0", "room 1", "room 2", "room 2"]
    assert [r.done for r in results] == [False] * 6 + [True]
    assert all(r.reward is None for r in results)  # no step rewards: the credit is the estimator's
    assert "wall" in results[0].response and results[5].response.is_error
    assert await session.score(None) == 1.0
    short, _, ended = await walk(["east", "east", "west", "east"])
    assert not any(r.done for r in ended) and await short.score(None) == 0.0  # out of turns short of the exit


async def test_each_room_s_door_on_and_a_wrong_door_recoverable() -> None:
    doors = ["east", "west", "east"]
    session, keys, results = await walk(["west", "east", "east", "east", "west", "east"], doors=doors)
    # room 0's west is its door back (a wall), room 1's east leads back to room 0: each costs turns, not the walk
    assert keys == ["room 0", "room 0", "room 1", "room 0", "room 1", "room 2"]
    assert "wall" in results[0].response and results[2].response == "You are in the r0, room 1 of 3."
    assert [r.done for r in results] == [False] * 5 + [True] and all(r.reward is None for r in results)
    assert await session.score(None) == 1.0
    lost, _, ended = await walk(["east", "east", "east", "east"], doors=doors)  # east everywhere bounces between rooms 0 and 1
    assert not any(r.done for r in ended) and await lost.score(None) == 0.0 and await lost.state_key() == "room 0"
    with pytest.raises(ValueError, match="doors"):
        await walk([], doors=["east", "up", "east"])


async def test_the_key_counts_the_moves_when_asked() -> None:
    _, keys, _ = await walk(["east", "west", "east"], key_turns=True)
    assert keys == ["room 0 after 0 moves", "room 1 after 1 moves", "room 0 after 2 moves"]
    assert CORRIDOR.resolve({"key_turns": True})[0].session_options == {"key_turns": True}


async def test_a_clone_walks_on_apart() -> None:
    session, _, _ = await walk(["east"])
    twin = await session.clone()
    twin.step(ToolCall(name="move", arguments={"direction": "east"}))
    assert await session.state_key() == "room 1" and await twin.state_key() == "room 2"
    assert session.step(ToolCall(name="move", arguments={"direction": "east"})).done is False
    assert twin.step(ToolCall(name="move", arguments={"direction": "east"})).done is True
    assert await twin.score(None) == 1.0 and await session.score(None) == 0.0


async def test_a_group_recurs_through_the_same_rooms(qwen3_tokenizer: Any) -> None:
    config = load_config(None, data={"env": "corridor", "env_options": {"rooms": 3}})
    sample = load_samples(config, "test")[0]
    e, w = "<move>east</move>", "<move>west</move>"
    scripts = {"g0-0": [e, e, e], "g0-1": [e, w, e, e, e], "g0-2": [w, e, w, w, e, w]}
    routes, parts = await build_routes(config, [sample])
    ctx = RolloutContext(engine=ScriptedEngine(qwen3_tokenizer, scripts), config=config.rollout, routes=routes,
                         renderer_factory=lambda schemas: ChatRenderer(qwen3_tokenizer, schemas))
    try:
        straight, detour, lost = await run_rollouts(ctx, [sample], n=3, seed=0)
    finally:
        for part in parts:
            await part.close()
    assert (straight.termination, straight.turns, straight.reward) == ("done", 3, 1.0)
    assert (detour.termination, detour.turns, detour.reward) == ("done", 5, 1.0)
    assert (lost.termination, lost.turns, lost.reward) == ("max_turns", 6, 0.0)  # max_turns: 2 × 3 rooms
    def rooms(t: Any) -> list[str]:  # the rollout keys a session's state as env:KEY
        return [s.removeprefix("env:") for s in t.turn_states]

    assert all(s.startswith("env:") for t in (straight, detour, lost) for s in t.turn_states)
    assert rooms(straight) == ["room 0", "room 1", "room 2"]
    assert rooms(detour) == ["room 0", "room 1", "room 0", "room 1", "room 2"]
    assert rooms(lost) == ["room 0", "room 0", "room 1", "room 0", "room 0", "room 1"]
    # every trajectory of the group starts a turn from rooms 0 and 1: gigpo's step groups compare them
    assert set(straight.turn_states[:2]) <= set(detour.turn_states) & set(lost.turn_states)
