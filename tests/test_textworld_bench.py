"""benchmarks/textworld_claims.py's figures from outputs it printed (``--logs``), on small synthetic outputs: the seeds
of two parts read together, each claim's last line, and nothing of toolrl or the TextWorld plugin imported
(``--logs`` runs where neither is installed); and a run's rollout figures (``--rollouts``) from synthetic rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# toolrl and the plugin made unimportable: --logs must not need them.
RUN = ("import runpy, sys; sys.modules['toolrl'] = sys.modules['toolrl_textworld'] = None; "
       "sys.path.insert(0, {bench!r}); sys.argv = ['textworld_claims.py', *sys.argv[1:]]; "
       "runpy.run_path({script!r}, run_name='__main__')")
SEED = "{arm} seed {seed}: 900 s, 90 s a step, peak 9.5 GiB; held-out won at tokens (by level): {points}; {extra}"
CREDIT = {("grpo", 0): "4@100(4) 8@200(8)", ("grpo", 1): "6@100(6) 10@200(10)",
          ("gigpo", 0): "6@100(6) 10@200(10)", ("gigpo", 1): "8@100(8) 12@200(12)",
          ("tree_grpo", 0): "3@80(3) 9@160(9) 12@240(12)", ("tree_grpo", 1): "5@80(5) 7@160(7) 10@240(10)"}
CURRICULUM = {("uniform", 0): "7@100(5/2/0/0) 9@200(6/2/1/0)", ("uniform", 1): "8@100(5/3/0/0) 11@200(6/3/1/1)",
              ("pass_rate", 0): "9@100(6/2/1/0) 12@200(7/3/1/1)", ("pass_rate", 1): "8@100(5/2/1/0) 10@200(6/3/1/0)",
              ("env_difficulty", 0): "7@100(5/2/0/0) 13@200(7/4/1/1)",
              ("env_difficulty", 1): "7@100(5/2/0/0) 12@200(7/3/1/1)"}


def _logs(*paths: Path, flag: str = "--logs", before: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    code = RUN.format(bench=str(ROOT / "benchmarks"), script=str(ROOT / "benchmarks" / "textworld_claims.py"))
    return subprocess.run([sys.executable, "-c", code, *before, flag, *map(str, paths)], capture_output=True,
                          text=True, timeout=120)


def _outputs(tmp_path: Path, claim: str, untrained: str, runs: dict[tuple[str, int], str]) -> list[Path]:
    """Two outputs, seed 0 and seed 1, as two runs of ``--first-seed`` print them."""
    paths = []
    for seed in (0, 1):
        extra = (f"anchor states recur 30/40 turns (past the first turn 10/20); turn-level part of the advantage: mean "
                 f"|a - its trajectory's| {0.1 + 0.2 * seed:.3f} against mean |a| 1.000 over {40 + 20 * seed} turns, "
                 f"{seed} of the other sign")
        seeds = [SEED.format(arm=arm, seed=s, points=points, extra=extra if arm == "gigpo" else "")
                 for (arm, s), points in runs.items() if s == seed]
        path = tmp_path / f"{claim}-{seed}.txt"
        path.write_text("\n".join(["machine: synthetic", f"claim: {claim}", untrained, *seeds]) + "\n")
        paths.append(path)
    return paths


def test_credit_figures_from_two_outputs(tmp_path):
    done = _logs(*_outputs(tmp_path, "credit", "untrained: 2/24 held-out won (2 by level), 24 a level; 50 s", CREDIT))
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert "mean over 2 seeds" in done.stdout
    assert ("target: 8.0/24 held-out won, the lowest of the grpo arm's 2 seeds' best (within its shortest run): "
            "every grpo seed reaches it") in out
    assert "grpo: tokens to target 175 (per seed: 200 150)" in out  # seed means 5 at 100, 9 at 200
    assert any(line.startswith("gigpo: anchor states recur for 75% of 80 training turns") for line in out)
    assert ("gigpo: turn-level part of the advantage (seeds with the figure): mean |a - its trajectory's| 0.220 "
            "against mean |a| 1.000 over 100 turns, 1.0% of the other sign") in out  # (0.1 · 40 + 0.3 · 60) / 100
    assert out[-3].startswith("tokens to target, tree_grpo/grpo: 0.91 [")
    assert out[-2] == "the better of gigpo and tree_grpo by point estimate: gigpo"
    assert out[-1].startswith("tokens to target, gigpo or tree_grpo / grpo: 0.71 [")  # 125 / 175


def test_other_targets_are_reported_beside_the_protocols_and_the_last_line_stays_its(tmp_path):
    paths = _outputs(tmp_path, "credit", "untrained: 2/24 held-out won (2 by level), 24 a level; 50 s", CREDIT)
    done = _logs(*paths, before=("--targets", "6,9"))
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    at = out.index("other targets (not the protocol's; held-out plays won of 24): each arm's tokens to it; its ratio "
                   "to grpo's [90% interval]")
    # seed means from 2 at 0 tokens: grpo 5 at 100, 9 at 200; gigpo 7, 11; tree_grpo 4 at 80, 8 at 160, 11 at 240
    assert out[at + 1].startswith("6: grpo 125, gigpo 80, tree_grpo 120; gigpo/grpo 0.64 [")
    assert out[at + 2].startswith("9: grpo 200, gigpo 150, tree_grpo 187; gigpo/grpo 0.75 [")
    assert out[-1] == _logs(*paths).stdout.splitlines()[-1]  # the protocol's target still makes the last line


def test_curriculum_figures_by_level_and_the_hardest(tmp_path):
    untrained = "untrained: 5/32 held-out won (4/1/0/0 by level), 8 a level; 80 s"
    done = _logs(*_outputs(tmp_path, "curriculum", untrained, CURRICULUM))
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert ("env_difficulty: hardest level (quest_length=4) held-out won 1.0/8 at the end (per seed 1 1; "
            "untrained 0; best on the way 1 1)") in out
    assert "the better of pass_rate and env_difficulty by point estimate: pass_rate" in out
    assert out[-1].startswith("tokens to target, curriculum/uniform: 0.75 [")  # 120 / 160


def test_an_output_without_runs_is_refused(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("machine: nothing ran\nclaim: credit\n")
    refused = _logs(empty)
    assert refused.returncode != 0 and "no claim line, untrained line or per-seed line" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_no_target_when_the_base_arm_never_rises_above_the_untrained_level(tmp_path):
    """Every arm starts at the untrained level: a target there is reached at 0 tokens and says nothing."""
    flat = {key: "2@100(2) 2@200(2)" if key[0] == "grpo" else points for key, points in CREDIT.items()}
    done = _logs(*_outputs(tmp_path, "credit", "untrained: 2/24 held-out won (2 by level), 24 a level; 50 s", flat))
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert "target: none: a grpo seed never rose above the untrained 2.0/24 held-out won" in out
    assert out[-1] == "tokens to target, gigpo or tree_grpo / grpo: n/a [no target: the grpo arm did not learn]"


def test_rollout_figures_of_a_run(tmp_path):
    """Anchor recurrence and the turn-level part of the advantage from a run's rows: a two-turn row whose turns
    were credited -1 and 3, and a one-turn row of its group from the same first state."""
    rows = [{"trajectory_id": "a", "group": 0, "turn_states": ["env:x", "env:y"], "turn_starts": [0, 2],
             "response_mask": [1, 0, 1, 0], "advantage": [-1.0, -1.0, 3.0, 3.0]},
            {"trajectory_id": "b", "group": 0, "turn_states": ["env:x"], "turn_starts": [0],
             "response_mask": [1, 1], "advantage": [-1.0, -1.0]}]
    run = tmp_path / "rollouts"
    run.mkdir()
    (run / "step_00001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = _logs(run, flag="--rollouts")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{run}: anchor states recur 2/3 turns (past the first turn 0/1); turn-level part of the advantage: mean "
        "|a - its trajectory's| 1.333 against mean |a| 1.667 over 3 turns, 1 of the other sign"]


def test_tree_figures_of_a_run(tmp_path):
    """A tree run's rows (one advantage a leaf, no turn states): the trees whose leaves scored differently."""
    rows = [{"group": 0, "tree_id": tree, "reward": reward, "advantage": 0.5, "response_mask": [1], "turn_starts": [0]}
            for tree, reward in ((0, 1.0), (0, 0.0), (1, 0.0), (1, 0.0))]
    run = tmp_path / "rollouts"
    run.mkdir()
    (run / "step_00001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = _logs(run, flag="--rollouts")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{run}: trees whose leaves scored differently 1/2 (groups 1/1)"]


def test_levels_trained_of_a_curriculum_run(tmp_path):
    """The games a step trained on by level: a group is one game (its samples' rows counted once), its level the
    one its training split gave it. The split below dropped a game of level 0 (as the plugin drops a training game
    that is also a held-out one), so index // games-a-level would put indices 3-14 a level too high."""
    level_of = {i: level for i, level in enumerate([0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3])}
    steps = []
    for games in ([(0, 1), (1, 5), (2, 12), (3, 14)], [(0, 2), (1, 6), (2, 7), (3, 11)]):
        steps.append([{"group": g, "sample_index": i, "response_mask": [1], "turn_starts": [0], "advantage": 0.0}
                      for g, i in games for _ in range(2)])
    code = ("import json, runpy, sys; sys.modules['toolrl'] = sys.modules['toolrl_textworld'] = None; "
            f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
            f"bench = runpy.run_path({str(ROOT / 'benchmarks' / 'textworld_claims.py')!r}); "
            f"level_of = {{int(k): v for k, v in json.loads({json.dumps(json.dumps(level_of))}).items()}}; "
            f"got = bench['rollout_figures'](json.loads({json.dumps(json.dumps(steps))}), level_of, 4); "
            "print(bench['figures_line']({'curriculum': [], **got}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["games trained by level a step 1/1/0/2 1/1/1/1"]
