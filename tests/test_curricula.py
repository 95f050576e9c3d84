"""Curricula (docs/curricula.md): the default draws the data's own order and records nothing; the built-ins'
pools, revisits and levels, with stale groups weighted; each built-in and a curriculum written from the
docs alone pass the kit (restarted from its state at every step, it draws what it drew left alone); a
killed run resumes to the uninterrupted run's draws and figures; bad options are one line before anything
loads; evaluation takes every held-out problem whatever the curriculum. A curriculum's mistakes cost one line
or one warning and no run: a state that is not JSON (its checkpoint not written, the one before whole), a
checkpoint that fails half-way leaves nothing, figures that are no finite numbers are left out, a choice
outside the samples, and a resume that starts the curriculum afresh says so."""

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _processes import straight_and_resumed
from test_trainer import TINY, lines
from toolrl.config import ConfigError, load_config
from toolrl.curricula import Curriculum, EnvDifficulty, GroupOutcome, PassRate, TrainingSet
from toolrl.data.batches import StepBatch, prompt_for_group
from toolrl.data.draws import CURRICULUM, open_draws
from toolrl.environments import Environment
from toolrl.plugins import get_plugins
from toolrl.plugins.registry import Part
from toolrl.processes.prepare import check_training
from toolrl.schemas import Sample
from toolrl.testing import check_curriculum, play_curriculum
from toolrl.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]


def samples(n: int, env: str | None = "play", levels: int = 0) -> list[Sample]:
    return [Sample(prompt=[{"role": "user", "content": f"task {i}"}], env=env, index=i,
                   level=i % levels if levels else None) for i in range(n)]


def outcome(group: int, sample: int, passed: int, of: int = 4, version: int = 0, step: int = 1) -> GroupOutcome:
    return GroupOutcome(group, sample, tuple([1.0] * passed + [0.0] * (of - passed)), version, step)


def test_the_default_draws_the_data_order_and_records_nothing(tmp_path):
    config = load_config(TINY, ["env_options.train_size=8"])
    data = samples(8)
    draws = open_draws(config, data)
    assert [draws.prompt(g) for g in range(20)] == [prompt_for_group(data, g, 0, True) for g in range(20)]
    draws.observe({g: [] for g in range(20)}, 1)
    draws.save(tmp_path)
    assert draws.metrics() == {} and not (tmp_path / CURRICULUM).exists()
    named = open_draws(load_config(TINY, ["data.curriculum={name: uniform}"]), data)
    assert [named.prompt(g) for g in range(20)] == [prompt_for_group(data, g, 0, True) for g in range(20)]


@pytest.mark.parametrize("ahead", [0, 2], ids=["synchronous", "two-steps-ahead"])
@pytest.mark.parametrize(("name", "options"), [
    ("uniform", {}),
    ("pass_rate", {"shares": {"easy": 0.1, "normal": 0.8, "hard": 0.1}, "revisit": 0.2, "window": 2}),
    ("env_difficulty", {"window": 4}),
])
def test_each_built_in_passes_the_kit(name, options, ahead):
    choices = check_curriculum(name, options, ahead=ahead)
    if name != "uniform":  # it followed the played policy: not the data order
        assert choices != play_curriculum("uniform", ahead=ahead)[0]


def test_a_curriculum_written_from_the_docs_alone_passes_the_kit():
    """The examples of docs/plugins.md ("register_curricula"), run as they are written there: the curriculum,
    then its test."""
    text = (ROOT / "docs" / "plugins.md").read_text()
    section = re.search(r"### `register_curricula\(register\)`(.*?)\n### ", text, re.S).group(1)
    curriculum, test = re.findall(r"```python\n(.*?)```", section, re.S)
    scope: dict = {}
    exec(curriculum, scope)
    registry = get_plugins().registry
    if not registry.has("curricula", "least_seen"):
        registry.add(Part("curricula", "least_seen", "tests", scope["LeastSeen"]))
    choices = [i for step in check_curriculum("least_seen") for i in step]
    assert sorted(choices[:24]) == sorted(choices[24:]) == list(range(24))  # each prompt once, then again
    exec(test, scope)
    assert scope["curriculum"].drawn == {0: 1}


def test_pass_rate_pools_shares_and_revisits():
    data = TrainingSet(samples(8), seed=3)
    curriculum = PassRate(PassRate.Options(revisit=0.0, window=2), data)
    for g, (sample, passed) in enumerate([(0, 4), (1, 4), (2, 0), (3, 0), (4, 2)]):
        curriculum.observe(outcome(g, sample, passed))
    assert [curriculum.pool(i) for i in range(8)] == ["easy", "easy", "hard", "hard", "normal", "normal", "normal", "normal"]
    assert curriculum.metrics()["pool"] == {"easy": 2, "normal": 4, "hard": 2, "unseen": 3}
    drawn = [curriculum.choose(g) for g in range(10, 42)]
    assert set(drawn) <= {4, 5, 6, 7}  # shares {normal: 1}: neither the easy nor the hard prompts
    wasted = sum(data.uniform(g) in (0, 1, 2, 3) for g in range(10, 42))
    assert sum(avoided for _, avoided in curriculum.pending.values()) == wasted > 0
    # Each group drawn from the normal pool takes the data order's prompt where that one is normal.
    assert all(c == data.uniform(g) for g, c in zip(range(10, 42), drawn, strict=True) if data.uniform(g) >= 4)
    # Every group a revisit: the hard prompt drawn longest ago, in turn; one that passes leaves the pool.
    revisits = PassRate(PassRate.Options(revisit=1.0, window=2), data)
    revisits.load_state_dict(curriculum.state_dict())
    assert [revisits.choose(g) for g in (50, 51, 52)] == [2, 3, 2]
    assert {revisits.pending[g][0] for g in (50, 51, 52)} == {"revisit"}
    revisits.observe(outcome(50, 2, 1))  # a rolling pass rate of 1/8 over its two groups: normal now
    assert revisits.pool(2) == "normal" and revisits.choose(53) == 3
    assert revisits.metrics()["drawn"]["revisit"] == 1.0


def test_pass_rate_refuses_shares_that_do_not_sum_to_one_and_crossed_bounds():
    with pytest.raises(ValueError, match="easy \\+ normal \\+ hard is 1.1: the shares must sum to 1"):
        PassRate.Options.model_validate({"shares": {"easy": 0.5, "normal": 0.6}})
    with pytest.raises(ValueError, match=r"hard_at \(0.5\) must be below easy_at \(0.5\)"):
        PassRate.Options(easy_at=0.5, hard_at=0.5)


def test_stale_groups_count_less():
    data = TrainingSet(samples(4))
    curriculum = PassRate(PassRate.Options(window=2, stale_weight=0.5, easy_at=0.9, hard_at=0.1), data)
    fresh, stale = outcome(0, 0, 0, version=4, step=5), outcome(1, 0, 4, version=2, step=5)
    assert (fresh.staleness, stale.staleness) == (0, 2)
    curriculum.observe(fresh)
    curriculum.observe(stale)
    assert curriculum.records[0] == [[0.0, 1.0], [1.0, 0.25]]  # a pass rate of 0.25/1.25 = 0.2: normal
    assert curriculum.pool(0) == "normal"


def test_a_step_shows_each_of_its_groups_once_with_its_oldest_version():
    """The controller's side: a step's trajectories (numbered from 0 in the synchronous loop) grouped by
    their global group; each group's rewards once per trajectory, its version the oldest that sampled it."""
    def traj(key: str, group: int, reward: float, versions: list[int], **extra) -> Trajectory:
        return Trajectory(trajectory_id=key, sample_index=0, group=group, prompt_ids=[1], reward=reward,
                          policy_versions=versions, **extra)

    generated = [traj("a", 0, 1.0, [3]), traj("b", 0, 0.0, [2, 3]),
                 traj("c0", 1, 0.5, [3], trajectory_key="c"), traj("c1", 1, 0.5, [3], trajectory_key="c", piece=1),
                 traj("d", 1, 0.0, [3]), traj("e", 2, 1.0, [3], termination="infra_error")]
    batch = StepBatch(groups=[4, 5], skipped=[6], generated=generated, end=7, offset=4)
    groups = batch.by_group()
    assert {g: [t.trajectory_id for t in ts] for g, ts in groups.items()} == {4: ["a", "b"], 5: ["c0", "c1", "d"], 6: []}
    config = load_config(TINY, ["data.curriculum={name: pass_rate}"])
    draws = open_draws(config, samples(8))
    seen = []
    draws.curriculum.observe = seen.append
    for g in (4, 5, 6):
        draws.prompt(g)
    draws.observe(groups, 5)
    assert [(o.group, o.rewards, o.version, o.step) for o in seen] == [(4, (1.0, 0.0), 2, 5), (5, (0.5, 0.0), 3, 5)]
    assert draws.chosen == {} and draws.metrics()["curriculum"]["zero_variance"] == 0.0
    # A group it never drew (a batch a run without a curriculum generated ahead, resumed): the data order's prompt.
    draws.observe({9: [traj("f", 0, 1.0, [4]), traj("g", 0, 1.0, [4])]}, 6)
    assert (seen[-1].sample, seen[-1].rewards) == (draws.curriculum.data.uniform(9), (1.0, 1.0))
    assert draws.metrics()["curriculum"]["zero_variance"] == 1.0


def test_env_difficulty_moves_each_route_up_and_down_by_the_pass_rate_at_its_level():
    data = TrainingSet(samples(12, "a", levels=3) + samples(6, "b", levels=3), seed=1,
                       levels={"a": ["one", "two", "three"], "b": ["x", "y", "z"]})
    curriculum = EnvDifficulty(EnvDifficulty.Options(window=2, up=0.75, down=0.25), data)

    def at(level: int, route: str) -> int:  # a prompt of the route at the level
        return next(i for i in data.routes[route] if data.samples[i].level == level)

    curriculum.observe(outcome(0, at(0, "a"), 4))
    assert curriculum.level == {"a": 0, "b": 0}  # one group is not yet a window
    curriculum.observe(outcome(1, at(0, "a"), 3))
    assert curriculum.level == {"a": 1, "b": 0}  # 7/8 passed: a level up, route b as it was
    chosen = [curriculum.choose(g) for g in range(40)]
    for g, c in zip(range(40), chosen, strict=True):
        route = data.samples[data.uniform(g)].env
        assert data.samples[c].env == route and data.samples[c].level == curriculum.level[route]
    route_a = [c for c in chosen if data.samples[c].env == "a"]
    assert sorted(route_a[:4]) == sorted(i for i in data.routes["a"] if data.samples[i].level == 1)  # each in turn
    curriculum.observe(outcome(2, at(0, "a"), 0))  # a stale level-0 group: its own record, no move
    curriculum.observe(outcome(3, at(1, "a"), 1))
    curriculum.observe(outcome(4, at(1, "a"), 0))
    assert curriculum.level["a"] == 0  # 1/8 at level 1: back down
    figures = curriculum.metrics()
    assert figures["level"] == {"a": 0, "b": 0} and figures["pass_rate"]["a"] == {"1": 0.125}
    curriculum.level["a"] = 2
    for g in (5, 6):
        curriculum.observe(outcome(g, at(2, "a"), 4))
    assert curriculum.level["a"] == 2  # the hardest level: nowhere higher to go


def test_env_difficulty_needs_levels_on_every_route():
    with pytest.raises(ValueError, match="environment 'b' exposes no difficulty levels"):
        EnvDifficulty(EnvDifficulty.Options(), TrainingSet(samples(4, "a", 2) + samples(4, "b"), levels={"a": ["1", "2"]}))
    with pytest.raises(ValueError, match="start: level 2, but environment 'a' has 2 levels"):
        EnvDifficulty(EnvDifficulty.Options(start=2), TrainingSet(samples(4, "a", 2), levels={"a": ["1", "2"]}))
    with pytest.raises(ValueError, match="environment 'a' has no training samples at level 'three'"):
        EnvDifficulty(EnvDifficulty.Options(), TrainingSet(samples(4, "a", 2), levels={"a": ["1", "2", "three"]}))


@pytest.mark.parametrize(("override", "message"), [
    ("data.curriculum={name: pass_rate, shares: {easy: 0.5, normal: 0.6}}",
     "override data.curriculum={name: pass_rate, shares: {easy: 0.5, normal: 0.6}}: data.curriculum.shares: "
     "easy + normal + hard is 1.1: the shares must sum to 1"),
    ("data.curriculum={name: env_difficulty, up: 1.5}",
     "override data.curriculum={name: env_difficulty, up: 1.5}: data.curriculum.up: Input should be less than or equal to 1"),
    ("data.curriculum={name: env_difficulty}",
     "override data.curriculum={name: env_difficulty}: data.curriculum: env_difficulty: environment 'arithmetic' exposes "
     "no difficulty levels (an environment's levels; toolrl env show NAME lists them)"),
    ("data.curriculum={name: pass_rat}",
     "override data.curriculum={name: pass_rat}: data.curriculum.name: unknown curriculum 'pass_rat' (did you mean "
     "'pass_rate'?"),
])
def test_bad_options_are_one_line_before_anything_loads(tmp_path, override, message):
    config = load_config(TINY, [f"trainer.output_dir={tmp_path}", override])
    with pytest.raises(ConfigError) as caught:
        check_training(config)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_a_curriculum_over_recorded_groups_is_refused_by_the_cli(tmp_path):
    done = subprocess.run([sys.executable, "-m", "toolrl", "train", TINY, f"data.trajectories={tmp_path / 'x.jsonl'}",
                           "data.curriculum={name: pass_rate}", "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert "data: curriculum: recorded groups (data.trajectories) are trained in their recorded order" in done.stderr


def ladder(options, split: str) -> list[Sample]:
    """Two levels of prompts; the test split 4 of each."""
    count = 8 if split == "train" else 4
    return [Sample(prompt=[{"role": "user", "content": f"Say {'a' * (level + 1)} ({split} {i})."}], level=level,
                   ground_truth={"level": level}) for level in (0, 1) for i in range(count)]


LADDER = Environment(name="ladder", splits={"train": ladder, "test": ladder}, levels=["short", "long"],
                     rewards=[{"name": "format", "options": {"pattern": "a"}}], max_turns=1)


def test_evaluation_takes_every_held_out_problem_whatever_the_curriculum(tmp_path):
    """A run at level 1 of two trains on level-1 prompts only and validates on all 8 held-out problems."""
    from toolrl.processes.controller import train_async

    registry = get_plugins().registry
    if not registry.has("environments", "ladder"):
        registry.add(Part("environments", "ladder", "tests", LADDER))
    config = load_config(TINY, [f"trainer.output_dir={tmp_path}", "env=ladder", "env_options={}", "tools.entries=[]",
                                "data.curriculum={name: env_difficulty, start: 1}", "trainer.total_steps=1",
                                "trainer.eval_every=1", "rollout.n=2", "rollout.max_new_tokens=4",
                                "rollout.max_response_tokens=4", "trainer.plot=false", "trainer.progress=false"])
    asyncio.run(train_async(config))
    trained = lines(tmp_path / "rollouts" / "step_00001.jsonl")
    assert {t["ground_truth"]["level"] for t in trained} == {1}
    held_out = lines(tmp_path / "eval" / "step_00001.jsonl")
    assert sorted(r["problem"] for r in held_out) == list(range(8))
    assert sorted(r["ground_truth"]["level"] for r in held_out) == [0] * 4 + [1] * 4
    (row,) = lines(tmp_path / "metrics.jsonl")
    assert row["curriculum"]["level"] == {"ladder": 1}


def test_only_the_controller_draws():
    """One decision per run: the curriculum is built, asked and shown in the controller's process (its
    data and checkpoints); no trainer rank or rollout worker holds one."""
    from test_layers import GRAPH

    users = sorted(m for m, targets in GRAPH.items() if {"toolrl.curricula", "toolrl.data.draws"} & targets)
    assert users == ["toolrl.data.batches", "toolrl.data.draws", "toolrl.processes.controller", "toolrl.processes.prepare",
                     "toolrl.testing.curricula"]


def test_a_streaming_run_checkpoints_the_prompts_of_its_groups_in_flight(tmp_path):
    """Under the stream (max_staleness 1) the groups of the step ahead are drawn before the checkpoint: it
    keeps their prompts, which the next step then trains on; every group is shown with its staleness."""
    from toolrl.processes.controller import train_async

    config = load_config(TINY, [f"trainer.output_dir={tmp_path}", "trainer.total_steps=3", "trainer.max_staleness=1",
                                "env_options.train_size=8", "rollout.n=2", "rollout.max_new_tokens=4",
                                "rollout.max_response_tokens=4", "data.curriculum={name: pass_rate, revisit: 0.5}",
                                "trainer.plot=false", "trainer.progress=false"])
    asyncio.run(train_async(config))
    saved = json.loads((tmp_path / "checkpoints" / "step_000002" / CURRICULUM).read_text())
    assert sorted(g for g, _ in saved["chosen"]) == [4, 5]  # drawn for step 3 while step 2 trained
    step3 = lines(tmp_path / "rollouts" / "step_00003.jsonl")
    assert sorted({(t["group"], t["sample_index"]) for t in step3}) == sorted(map(tuple, saved["chosen"]))
    assert all(row["curriculum"]["pool"]["unseen"] < 8 for row in lines(tmp_path / "metrics.jsonl"))


@pytest.mark.slow
def test_a_killed_pass_rate_run_resumes_to_the_uninterrupted_draws(tmp_path, monkeypatch, toolrl_reload_plugins):
    """Killed after its second checkpoint and resumed, a run whose prompts the pass-rate pools draw gives
    every step the uninterrupted run's prompts and figures (its curriculum's among them)."""
    steps = 4

    def args(out):
        return ["train", TINY, f"trainer.total_steps={steps}", f"trainer.output_dir={out}", "trainer.plot=false",
                "trainer.progress=false", "env_options.train_size=6", "rollout.n=2", "rollout.max_new_tokens=8",
                "rollout.max_response_tokens=16", "reward.functions=[{name: even_tokens}]", "data.batch_size=3",
                "data.curriculum={name: pass_rate, shares: {easy: 0.3, normal: 0.4, hard: 0.3}, revisit: 0.3, "
                "window: 1, pass_reward: 0.5, easy_at: 0.5, hard_at: 0.0}"]

    want, got = straight_and_resumed(args, tmp_path, steps, monkeypatch, toolrl_reload_plugins)
    assert got == want
    prompts = {run: [[t["sample_index"] for t in lines(tmp_path / run / "rollouts" / f"step_{s:05d}.jsonl")]
                     for s in range(1, steps + 1)] for run in ("straight", "killed")}
    assert prompts["killed"] == prompts["straight"]
    # The pools drew: some step's groups came from outside the normal pool.
    assert any(r["curriculum"]["drawn"]["normal"] < 1 for r in want[1:]), [r["curriculum"] for r in want]
    assert json.loads((tmp_path / "killed" / "checkpoints" / "step_000004" / CURRICULUM).read_text())["name"] == "pass_rate"


# -- a part's mistakes: one line, or one warning, and no run lost ------------------------------------


class SetState(Curriculum):
    """The steps it was shown: a list in its state until step 2, a set from then on (not JSON)."""

    name = "set_state"

    def __init__(self, options, data):
        super().__init__(options, data)
        self.steps = []

    def observe(self, outcome):
        self.steps.append(outcome.step)

    def state_dict(self):
        return {"steps": set(self.steps) if max(self.steps, default=0) >= 2 else list(self.steps)}


class SetFromTheStart(SetState):
    name = "set_from_the_start"

    def __init__(self, options, data):
        super().__init__(options, data)
        self.steps = [2]


class NanFigures(Curriculum):
    """Figures no row may hold: NaN, an infinity deep down, a word; besides one good figure."""

    name = "nan_figures"

    def metrics(self):
        return {"good": 1.0, "nan": float("nan"), "deep": {"inf": float("-inf")}, "word": "many"}


def registered(curriculum: type[Curriculum]) -> str:
    registry = get_plugins().registry
    if not registry.has("curricula", curriculum.name):
        registry.add(Part("curricula", curriculum.name, "tests", curriculum))
    return curriculum.name


def tiny_run(out: Path, *overrides: str) -> list[str]:
    return [f"trainer.output_dir={out}", "env_options.train_size=4", "rollout.n=2", "rollout.max_new_tokens=4",
            "rollout.max_response_tokens=4", "trainer.plot=false", "trainer.progress=false", *overrides]


def test_a_state_that_is_not_json_is_one_line_and_the_last_checkpoint_is_kept(tmp_path):
    """Checked where state_dict() returns it: the error names the curriculum and its plugin, the checkpoint
    it was for is not begun, and the one before stays whole, a run resumes from it."""
    from toolrl.processes.controller import train_async

    name = registered(SetState)
    config = load_config(TINY, tiny_run(tmp_path, "trainer.total_steps=2", "trainer.save_every=1",
                                        f"data.curriculum={{name: {name}}}"))
    with pytest.raises(ConfigError) as caught:
        asyncio.run(train_async(config))
    assert str(caught.value) == ("curriculum 'set_state' (plugin 'tests'): state_dict() returned something that is "
                                 "not JSON: the state['steps'] is a set ({1, 2}); the checkpoint of step 2 is not "
                                 "written (--resume continues from step_000001)")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["hf", "step_000001"]  # no .tmp_step_000002
    assert json.loads((tmp_path / "checkpoints" / "step_000001" / CURRICULUM).read_text())["state"] == {"steps": [1, 1]}
    assert check_training(config, resume=True).run_dir.latest_checkpoint().name == "step_000001"
    # A state that is not JSON from the start: one line before anything loads.
    fresh = registered(SetFromTheStart)
    with pytest.raises(ConfigError, match=r"^curriculum 'set_from_the_start' \(plugin 'tests'\): state_dict\(\) returned "
                                          r"something that is not JSON: the state\['steps'\] is a set \(\{2\}\)$"):
        check_training(load_config(TINY, tiny_run(tmp_path / "fresh", f"data.curriculum={{name: {fresh}}}")))


def test_a_checkpoint_that_fails_half_way_leaves_no_trace_and_the_last_one_whole(tmp_path, monkeypatch):
    """Whole or not at all: a checkpoint whose writing fails after the trainer wrote its shards (the disk
    filled up) leaves no staging directory; the one before it is what --resume reads."""
    from toolrl.data.draws import Draws
    from toolrl.processes.controller import train_async

    save = Draws.save

    def full(self, checkpoint, state=None):
        if checkpoint.name.endswith("_000002"):
            assert any(checkpoint.iterdir())  # the trainer's part is written
            raise OSError(28, "No space left on device")
        save(self, checkpoint, state)

    monkeypatch.setattr(Draws, "save", full)
    config = load_config(TINY, tiny_run(tmp_path, "trainer.total_steps=2", "trainer.save_every=1",
                                        "data.curriculum={name: pass_rate}"))
    with pytest.raises(OSError, match="No space left on device"):
        asyncio.run(train_async(config))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["hf", "step_000001"]
    assert check_training(config, resume=True).run_dir.latest_checkpoint().name == "step_000001"


def strict_lines(path: Path) -> list[dict]:
    """A JSONL file's rows, refusing NaN and infinities (Python's json reads them; JSON has none)."""
    def refuse(constant):
        raise ValueError(f"{constant} in {path}")

    return [json.loads(x, parse_constant=refuse) for x in path.read_text().splitlines() if x.strip()]


def test_a_figure_that_is_no_finite_number_is_left_out_with_one_warning(tmp_path, caplog):
    """Checked where metrics() returns it: each bad figure is named once in the log with the curriculum and
    its plugin, left out of every row, and the run goes on."""
    from toolrl.processes.controller import train_async

    name = registered(NanFigures)
    config = load_config(TINY, tiny_run(tmp_path, "trainer.total_steps=2", f"data.curriculum={{name: {name}}}"))
    with caplog.at_level("WARNING", logger="toolrl.data.draws"):
        asyncio.run(train_async(config))
    rows = strict_lines(tmp_path / "metrics.jsonl")
    assert [row["curriculum"] for row in rows] == [{"zero_variance": 1.0, "good": 1.0, "deep": {}}] * 2
    warned = [r.getMessage() for r in caplog.records if r.name == "toolrl.data.draws"]
    assert sorted(warned) == [f"curriculum 'nan_figures' (plugin 'tests'): metrics(): {why}: left out of the metrics "
                              "row (said once)" for why in ("curriculum/deep/inf = -inf, not a finite number",
                                                            "curriculum/nan = nan, not a finite number",
                                                            "curriculum/word = 'many', not a finite number")]


def test_metrics_that_are_no_mapping_are_left_out_with_one_warning(caplog):
    config = load_config(TINY, ["data.curriculum={name: pass_rate}"])
    draws = open_draws(config, samples(8))
    draws.curriculum.metrics = lambda: [0.5]
    with caplog.at_level("WARNING", logger="toolrl.data.draws"):
        assert draws.metrics() == draws.metrics() == {"curriculum": {}}
    assert [r.getMessage() for r in caplog.records if r.name == "toolrl.data.draws"] == [
        "curriculum 'pass_rate' (plugin 'curricula'): metrics(): curriculum = [0.5], not a mapping of figures: left "
        "out of the metrics row (said once)"]


def test_a_resume_that_starts_the_curriculum_afresh_says_so(tmp_path, caplog):
    """A checkpoint of a run that named no curriculum, or of another curriculum (or a run that names none
    now): one warning naming the curriculum and what the checkpoint holds, not a silent restart."""
    from toolrl.processes.controller import train_async

    asyncio.run(train_async(load_config(TINY, tiny_run(tmp_path, "trainer.total_steps=1"))))
    checkpoint = tmp_path / "checkpoints" / "step_000001"
    assert not (checkpoint / CURRICULUM).exists()
    config = load_config(TINY, tiny_run(tmp_path, "trainer.total_steps=2", "data.curriculum={name: pass_rate}"))
    with caplog.at_level("WARNING", logger="toolrl.data.draws"):
        check_training(config, resume=True)
        (checkpoint / CURRICULUM).write_text(json.dumps({"name": "env_difficulty", "chosen": [[2, 1]], "state": {}}))
        assert check_training(config, resume=True).draws.chosen == {2: 1}  # the groups drawn ahead keep theirs
        check_training(load_config(TINY, tiny_run(tmp_path, "trainer.total_steps=2")), resume=True)
    assert [r.getMessage() for r in caplog.records if r.name == "toolrl.data.draws"] == [
        f"--resume: curriculum 'pass_rate' (plugin 'curricula') starts afresh: {checkpoint} holds no {CURRICULUM} (the "
        "run named no curriculum until then)",
        f"--resume: curriculum 'pass_rate' (plugin 'curricula') starts afresh: {checkpoint / CURRICULUM} holds "
        "curriculum 'env_difficulty''s state (the groups drawn ahead keep their prompts)",
        f"--resume: {checkpoint / CURRICULUM} holds curriculum 'env_difficulty''s state, and data.curriculum is unset "
        "now: the data's own order from here"]


@pytest.mark.parametrize("choice", [8, -1, "3", True])
def test_a_choice_that_is_no_position_is_one_line_naming_the_curriculum(choice):
    draws = open_draws(load_config(TINY, ["data.curriculum={name: pass_rate}"]), samples(8))
    draws.curriculum.choose = lambda group: choice
    with pytest.raises(ConfigError) as caught:
        draws.prompt(5)
    assert str(caught.value) == (f"curriculum 'pass_rate' (plugin 'curricula'): choose(5) returned {choice!r}, not a "
                                 "position in the 8 training samples")
