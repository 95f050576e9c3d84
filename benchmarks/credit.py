"""Credit assignment across turns: success against generated tokens for ``grpo``, ``gigpo`` and
``tree_grpo`` on a task with an irreversible wrong step, 5 seeds each, the same token budget.

The real training loop (``toolrl.processes.controller.train_async``, what ``toolrl train`` runs, in one
process: the transformers engine and the trainer share the model) trains the tiny random Qwen3 with
its embeddings scaled up (peaked next-token distributions, as ``tests/test_trainer.py``'s
``peaked_tiny_model``). Only the task is the benchmark's own, a real environment session:

- ``Ladder``, an environment session of ``RUNGS`` rungs. Each model turn is one climb: the turn passes
  when at least half of its tokens are *aligned* (their initial embedding's first coordinate is
  positive: half the vocabulary, linearly separable in the model's own embedding space, so a tiny model
  can learn it in a few steps; the session re-encodes the turn's text, the parser's view of it). A
  passed rung earns a step reward ``1 / RUNGS`` (``StepResult.reward``: the existing step rewards); a
  failed one is irreversible: the episode ends there. Success: every rung passed (reward 1). Its
  ``state_key`` is the rung (``gigpo``'s anchor state); it clones (``tree_grpo``'s rollouts).
- ``StopStringMoves``, the parser: a random model writes no tool-call markup, so generation stops at
  an ``s`` (in about 1 token in 6) and a turn that stopped there is a climb; a turn that reaches
  ``rollout.max_new_tokens`` without one ends the trajectory (a failure).

Credit matters: with outcome-level advantages (``grpo``) a trajectory that passed two rungs and fell
at the third pushes its two good turns down; ``gigpo`` compares the turns taken from the same rung
with their discounted returns, ``tree_grpo`` compares leaves that share their first turns.

Generated tokens are the model's tokens (``response_mask`` 1) of every trajectory of each step, a
tree's shared prefix (before its leaves' ``split_point``) once: the tree arm splits once per tree
(``rollout.tree: {width: 4, depth: 1, turn: 1}``: ``n = 8`` gives 2 trees of 4 leaves per prompt, each
sharing its first turn), where the split point says exactly what is shared. The flat arms run
``--steps`` steps, the tree arm ``--tree-steps`` times as many (its steps generate fewer tokens); the
curves are compared up to the smallest total any run reached, the same budget for every arm.

Success is the training batch's, one sample per root (:func:`success_rate`: a flat trajectory, or a
tree's split leaves averaged), smoothed over the last budget/7 tokens (each step weighted by the
tokens it generated there: a window of tokens, not of steps, whose sizes differ between arms), reported
at 7 token checkpoints as the mean over seeds ± their std, then every seed's. Tokens to target: where the
seed-mean curve first reaches the target (on a grid of budget/100; each seed's own is printed too). The
target is a fixed 50% success on the ladder; with ``--env`` it is the level every ``grpo`` seed reaches,
the lowest of its seeds' best (smoothed) held-out success within the budget. Each ratio to ``grpo``'s
comes with a 90% interval over 2,000 seed bootstraps (each arm's seeds resampled with replacement, a fixed
RNG), a resample whose arm never reaches the target counting as inf.

On the ladder the step rewards already count the rungs passed and a failed rung ends the episode, so an
outcome advantage carries nearly all the credit there is. ``--env corridor`` (the ``corridor`` plugin,
plugins/corridor) trains on a task where credit matters: a row of rooms walked one ``move`` a turn, one
reward at the exit (none per step), a wrong move recoverable but two turns lost, ``max_turns`` twice the
rooms, the room as state key (every trajectory of a group passes the same rooms). The parser
:class:`AlignedMove` turns each turn into the environment's move (:data:`MOVES`: ``east`` when the turn
is aligned, else ``west``); the rest is the environment's own. ``--doors alternate|random`` (the
corridor's ``doors``) makes the door on east or west by room, so the right move depends on the room the
model reads in its context (the last response names it and its number), and a won walk holds both
moves: every run then also prints the wrong moves' share of won and of lost trajectories' moves (how
little an outcome says about a turn). Success is then the held-out split's:
``--eval-tasks`` test corridors, one sample each at the rollout temperature, after every step (the
tree arm's every ``--tree-steps`` steps, about as many tokens apart), and every run prints how often
the anchor states recur (the share of training turns whose state another turn of their group also
started from: a step group that compares something).

    OMP_NUM_THREADS=1 python benchmarks/credit.py [--quick] [--seeds 5] [--steps 12] [--tree-steps 2]
        [--env corridor [--rooms 5] [--turns N] [--stops s e] [--key-turns] [--doors alternate] [--eval-tasks 16]]
        [--arms ...] [--curves FILE] [--from FILE ...]

``--curves`` writes the runs' curves as they end, ``--from`` reads such files in place of running (arms
run as separate processes, then one table). The last lines, one per arm run besides ``grpo``:
``tokens to target, gigpo/grpo: X.XX [lo, hi]`` and ``tokens to target, tree_grpo/grpo: X.XX [lo, hi]``
(below 1: fewer tokens; ``n/a``: a seed mean never reached the target).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from _common import (
    RESAMPLES,
    machine,
    mean_tokens_to,
    ratio_line,
    ratio_to_target,
    seed_table,
    seed_target,
    single_thread,
    table,
    tokens_to,
)

single_thread()

from toolrl.config import RolloutConfig, load_config  # noqa: E402
from toolrl.parsers import ToolParser  # noqa: E402
from toolrl.plugins import get_plugins  # noqa: E402
from toolrl.plugins.registry import Part  # noqa: E402
from toolrl.schemas import ParseResult, ToolCall  # noqa: E402
from toolrl.sessions import EnvironmentSession, Reset, StepResult  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STOPS = ["s"]
RUNGS = 3
# --env: the environment plugin's move tool, its argument, an aligned turn's move and another's (AlignedMove).
MOVES = {"corridor": ("move", "direction", "east", "west")}
ARMS = {"grpo": [], "gigpo": ["algorithm.advantage=gigpo"],
        "tree_grpo": ["algorithm.advantage=tree_grpo", "rollout.tree={width: 4, depth: 1, turn: 1}"]}


class Aligned:
    """Whether a turn's text is mostly *aligned* tokens (module docstring), in the peaked model's embedding."""

    good: ClassVar[Any] = None  # bool tensor over the vocabulary, set from the model
    tokenizer: ClassVar[Any] = None

    @classmethod
    def turn(cls, text: str) -> bool:
        ids = cls.tokenizer.encode(text, add_special_tokens=False)
        return 2 * sum(bool(cls.good[t]) for t in ids) >= max(len(ids), 1)


class Ladder(EnvironmentSession):
    """``RUNGS`` climbs; a turn with fewer than half its tokens aligned falls, for good (module docstring)."""
    CLIMB = {"type": "function", "function": {"name": "climb", "description": "Climb one rung.", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}

    async def reset(self, sample: Any) -> Reset:
        self.rung = 0
        return Reset(tools=[self.CLIMB], replace_tools=True)

    def step(self, call: ToolCall) -> StepResult:
        if not Aligned.turn(call.arguments["text"]):
            return StepResult(response="You slipped and fell.", done=True)
        self.rung += 1
        return StepResult(response=f"Rung {self.rung} of {RUNGS}.", reward=1 / RUNGS, done=self.rung == RUNGS)

    async def state_key(self) -> str:
        return f"rung {self.rung}"

    async def clone(self) -> Ladder:
        return copy.copy(self)  # its state is one int


class StopStringMoves(ToolParser):
    """A turn that stopped at one of ``STOPS`` climbs (a random model writes no markup)."""

    name = "stop_string_moves"

    @property
    def stop_strings(self) -> list[str]:
        return STOPS

    def parse(self, text: str) -> ParseResult:
        if any(s in text for s in STOPS):
            return ParseResult(content=text, calls=[ToolCall(name="climb", arguments={"text": text})])
        return ParseResult(content=text)


class AlignedMove(StopStringMoves):
    """``--env``: a turn that stopped at one of ``STOPS`` is one call of the environment's move tool
    (:data:`MOVES`), the first move when the turn is :class:`Aligned`, else the second (a random model
    writes no markup; the environment's session, state and reward, which move is right, are its own)."""

    name = "aligned_move"
    move: ClassVar[tuple[str, str, str, str]] = ("", "", "", "")  # tool, argument, aligned, not aligned
    stops: ClassVar[list[str]] = STOPS  # --stops

    @property
    def stop_strings(self) -> list[str]:
        return self.stops

    def parse(self, text: str) -> ParseResult:
        if not any(s in text for s in self.stops):
            return ParseResult(content=text)
        tool, argument, aligned, other = self.move
        return ParseResult(content=text, calls=[ToolCall(name=tool, arguments={
            argument: aligned if Aligned.turn(text) else other})])


def register() -> None:
    registry = get_plugins().registry
    for kind, name, obj in (("environment_sessions", "ladder", Ladder),
                            ("tool_parsers", StopStringMoves.name, StopStringMoves),
                            ("tool_parsers", AlignedMove.name, AlignedMove)):
        if not registry.has(kind, name):
            registry.add(Part(kind, name, "benchmark", obj))


def peaked_model(out: Path) -> Path:
    """The tiny random Qwen3, embeddings × 6 (``tests/test_trainer.py``'s ``peaked_tiny_model``)."""
    import shutil

    import torch
    from toolrl.model_sources import load_model, tiny_qwen3
    from transformers import AutoTokenizer

    source = Path(tiny_qwen3())
    model = load_model(str(source))
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(6.0)
    Aligned.good = model.get_input_embeddings().weight[:, 0] > 0
    model.save_pretrained(out)
    for f in source.iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja") or f.name == "special_tokens_map.json":
            shutil.copy2(f, out / f.name)
    Aligned.tokenizer = AutoTokenizer.from_pretrained(out)
    return out


def run_arm(arm: str, seed: int, args: argparse.Namespace, model: Path, out: Path) -> list[tuple[int, float]]:
    """One run: per step, (generated tokens, success rate). A tree's step generates fewer tokens (its
    leaves share their first turns), so the tree arm runs ``--tree-steps`` × the steps to reach the same
    token budget (what no run reached is cut off). The ladder's success is the training batch's; an
    ``--env``'s is the held-out split's (``--eval-tasks`` test problems, one sample each at the rollout
    temperature, after every step: after every ``--tree-steps``-th of the tree arm's, about as many
    tokens apart), and the curve has a point only where it was measured."""
    from toolrl.processes.controller import train_async

    tree = arm == "tree_grpo"
    steps = args.steps * (args.tree_steps if tree else 1)
    if args.env is None:
        task = ["session.name=ladder", f"rollout.max_turns={RUNGS}", f"rollout.parser={StopStringMoves.name}",
                "rollout.max_response_tokens=256", "tools.entries=[]", "reward.functions=[]"]
    else:
        options = f"rooms: {args.rooms}, test_size: {args.eval_tasks}, seed: 0, doors: {args.doors}"
        task = [f"env={args.env}", f"env_options={{{options}{', key_turns: true' if args.key_turns else ''}}}",
                *([f"rollout.max_turns={args.turns}"] if args.turns else []),
                f"rollout.parser={AlignedMove.name}", "rollout.parser_options={}", "tools.entries=[]",
                "reward.functions=[]", f"rollout.max_response_tokens={args.max_response_tokens}",
                f"trainer.eval_every={args.tree_steps if tree else 1}", f"eval.num_samples={args.eval_tasks}",
                "eval.n=1", "eval.temperature=1.0"]
    config = load_config(ROOT / "examples" / "tiny.yaml", [
        f"model.source={model}", f"trainer.output_dir={out}", f"trainer.total_steps={steps}",
        f"trainer.seed={seed}", f"rollout.seed={seed}", "trainer.plot=false", "trainer.progress=false",
        "trainer.save_every=1000", "data.batch_size=2", "rollout.n=8",
        f"rollout.max_new_tokens={args.max_new_tokens}", *task,
        f"optim.lr={args.lr}", "optim.micro_batch_size=16", *ARMS[arm]])
    asyncio.run(train_async(config))
    metrics = {row["step"]: row for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    curve, tokens = [], 0
    for step in range(1, steps + 1):
        rows = [json.loads(x) for x in (out / "rollouts" / f"step_{step:05d}.jsonl").read_text().splitlines() if x]
        tokens += generated_tokens(rows)
        count_anchors(arm, rows)
        if args.env is not None:
            count_moves(arm, rows)
        if args.env is None:
            curve.append((tokens, success_rate(rows)))
        elif "val/pass@1" in metrics[step]:
            curve.append((tokens, metrics[step]["val/pass@1"]))
    return curve


ANCHORS: dict[str, list[int]] = {}  # per arm: turns in a step group of two or more, all turns


def count_anchors(arm: str, rows: Sequence[dict[str, Any]]) -> None:
    """How often ``gigpo``'s anchor states recur: the turns of a step whose state another turn of their
    group also started from (the step groups that compare anything), and all its turns."""
    anchors: dict[tuple[Any, str], int] = {}
    for r in rows:
        for state in r.get("turn_states") or []:
            anchors[(r["group"], state)] = anchors.get((r["group"], state), 0) + 1
    tally = ANCHORS.setdefault(arm, [0, 0])
    tally[0] += sum(n for n in anchors.values() if n > 1)
    tally[1] += sum(anchors.values())


MOVED: dict[str, list[int]] = {}  # --env, per arm: wrong moves, moves of won trajectories; of lost ones
SEEN = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)  # the Qwen3 template's tool results
ROOM = re.compile(r"room (\d+) of")


def count_moves(arm: str, rows: Sequence[dict[str, Any]]) -> None:
    """How little an outcome says about a turn: the wrong moves among the moves of won trajectories and
    of lost ones, read off the corridor's replies in the response (a right move is one that led one room
    on; the state keys cannot say: only ``gigpo``'s rollouts carry the rooms, the other arms key turns by
    the observation's hash). The last move's reply is not in the response: a won walk's was the exit, a
    lost one's is not counted."""
    tally = MOVED.setdefault(arm, [0, 0, 0, 0])
    for r in rows:
        room, right = 1, []
        for seen in SEEN.findall(r.get("response_text") or ""):
            now = int(m.group(1)) if (m := ROOM.search(seen)) else room
            right.append(now == room + 1)
            room = now
        won = r["reward"] > 1 - 1e-6
        right += [True] if won else []
        tally[0 if won else 2] += right.count(False)
        tally[1 if won else 3] += len(right)


def success_rate(rows: Sequence[dict[str, Any]]) -> float:
    """The policy's success rate estimated from a step's trajectories, one sample per root (a flat
    trajectory, or a tree's first line): a tree that split counts the share of its split leaves
    (``split_point`` > 0: continuations of one sampled prefix) that passed every rung, one whose line
    fell before the split turn that line's outcome. Per leaf it would be biased up for trees: a line
    that survives to the split counts four times, and a fallen line's made-up leaves (``split_point``
    0, sampled afresh because it fell: toolrl.rollout.tree) add samples only where the line failed."""
    roots: dict[Any, list[bool]] = {}
    for r in rows:
        root = r["trajectory_id"] if r.get("tree_id") is None else (r["group"], r["tree_id"])
        if r.get("split_point") != 0:  # a tree holds split leaves, or its unsplit line and made-up ones
            roots.setdefault(root, []).append(r["reward"] > 1 - 1e-6)
    return statistics.mean(sum(leaves) / len(leaves) for leaves in roots.values())


def generated_tokens(rows: Sequence[dict[str, Any]]) -> int:
    """The model tokens a step generated: every trajectory's, a tree's shared prefix once. With one split
    per tree (``depth: 1``) the leaves that split share the tokens before their ``split_point``."""
    total, counted = 0, set()
    for r in rows:
        mask, cut = r["response_mask"], r.get("split_point") or 0
        total += sum(mask[cut:])
        if cut and (r["group"], r["tree_id"]) not in counted:
            counted.add((r["group"], r["tree_id"]))
            total += sum(mask[:cut])
    return total


def at(budget: float, window: float, run: Sequence[tuple[float, float]]) -> float:
    """A run's success at ``budget`` tokens: its steps' success weighted by the tokens each generated in
    (budget - window, budget] (smoothed over a window of tokens, not of steps: a tree's steps are shorter)."""
    weighted = total = 0.0
    for (t0, _), (t1, s) in zip([(0.0, 0.0), *run], run):
        overlap = max(0.0, min(t1, budget) - max(t0, budget - window))
        weighted, total = weighted + overlap * s, total + overlap
    return weighted / total


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, 4 steps: a smoke run")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12, help="steps of the flat arms")
    ap.add_argument("--tree-steps", type=int, default=2, help="the tree arm's steps, × --steps")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="the ratios need grpo's "
                    "(here or in --from)")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5.0e-3)
    ap.add_argument("--checkpoints", type=int, default=7)
    ap.add_argument("--env", choices=list(MOVES), help="an environment plugin in place of the ladder: success "
                    "on its held-out split")
    ap.add_argument("--rooms", type=int, default=5, help="--env corridor: its length (max_turns 2 × rooms)")
    ap.add_argument("--key-turns", action="store_true",
                    help="--env corridor: the state key also counts the moves made (gigpo's step groups)")
    ap.add_argument("--doors", choices=["east", "alternate", "random"], default="east", help="--env corridor: "
                    "which door of each room leads on (alternate, random: the right move depends on the room)")
    ap.add_argument("--turns", type=int, help="--env: rollout.max_turns (default: the environment's)")
    ap.add_argument("--stops", nargs="+", default=STOPS, help="--env: the strings a turn stops at (more of them: "
                    "fewer turns that run out of tokens, which end the episode)")
    ap.add_argument("--eval-tasks", type=int, default=16, help="--env: held-out problems per evaluation")
    ap.add_argument("--max-response-tokens", type=int, default=512, help="--env: rollout.max_response_tokens")
    ap.add_argument("--curves", type=Path, help="also write the runs' curves here (JSON), for --from")
    ap.add_argument("--from", dest="sources", type=Path, nargs="+", help="read the curves that --curves wrote "
                    "(arms run apart, e.g. one process each) in place of running")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.steps = 1, 4
    register()
    tree = "tree" in RolloutConfig.model_fields
    arms = [a for a in args.arms if tree or a != "tree_grpo"]
    task = (f"a ladder of {RUNGS} rungs" if args.env is None else
            f"--env {args.env} ({args.rooms} rooms, doors {args.doors}, max_turns {args.turns or 'its own'}), held-out success on "
            f"{args.eval_tasks} test problems")
    success = "success" if args.env is None else "held-out success"
    print(f"machine: {machine()}")
    print(f"workload: peaked tiny-qwen3, {args.steps} steps × 2 prompts × 8, {task} (a turn "
          f"stops at {'/'.join(args.stops if args.env else STOPS)}, ≤ {args.max_new_tokens} tokens), lr {args.lr:g}, seeds 0-{args.seeds - 1}; "
          f"tree_grpo: rollout.tree width 4 depth 1 at turn 1\n")
    if args.sources:
        runs = load(args.sources)
    else:
        runs = {}
        if args.env is not None:
            AlignedMove.move, AlignedMove.stops = MOVES[args.env], args.stops
        with tempfile.TemporaryDirectory(prefix="credit-") as tmp:
            model = peaked_model(Path(tmp) / "model")
            for seed in range(args.seeds):
                for arm in arms:
                    t0 = time.perf_counter()
                    curve = run_arm(arm, seed, args, model, Path(tmp) / f"{arm}-{seed}")
                    runs.setdefault(arm, []).append(curve)
                    print(f"{arm} seed {seed}: {time.perf_counter() - t0:.0f} s, {curve[-1][0]} tokens, {success} "
                          + " ".join(f"{s:.2f}" for _, s in curve), flush=True)
                    if args.curves:
                        args.curves.write_text(json.dumps({"runs": runs, "anchors": ANCHORS, "moves": MOVED}))
    report(runs, args, tree)
    return 0


Runs = dict[str, list[list[tuple[float, float]]]]  # per arm, each seed's (tokens, success) points


def load(sources: Sequence[Path]) -> Runs:
    """The runs that ``--curves`` wrote to ``sources``, merged; their anchor and move tallies added up."""
    runs: Runs = {}
    for source in sources:
        saved = json.loads(source.read_text())
        for arm, curves in saved["runs"].items():
            runs.setdefault(arm, []).extend([[tuple(point) for point in c] for c in curves])
        for arm, (recurring, turns) in saved["anchors"].items():
            tally = ANCHORS.setdefault(arm, [0, 0])
            tally[0], tally[1] = tally[0] + recurring, tally[1] + turns
        for arm, counts in saved.get("moves", {}).items():
            MOVED[arm] = [a + b for a, b in zip(MOVED.get(arm, [0, 0, 0, 0]), counts)]
    return runs


def report(runs: Runs, args: argparse.Namespace, tree: bool) -> None:
    """The curves (seed mean ± std, then every seed's), the tallies, the target and each arm's tokens to it
    and, last, each arm's ratio to grpo's with its seed-bootstrap interval (module docstring)."""
    success = "success" if args.env is None else "held-out success"
    budget = min(run[-1][0] for rs in runs.values() for run in rs)
    window = budget / args.checkpoints
    marks = [window * (k + 1) for k in range(args.checkpoints)]
    checks = {arm: [[at(m, window, r) for m in marks] for r in rs] for arm, rs in runs.items()}
    print(f"\n{success} (mean ± std over {min(map(len, runs.values()))} seeds) at generated tokens, each over the "
          f"last {window:.0f} tokens; budget {budget:.0f} per run")
    print(table(["method", *[f"{m:.0f}" for m in marks]],
                [[arm, *(f"{statistics.mean(c):.2f}±{statistics.pstdev(c):.2f}" for c in zip(*vs))]
                 for arm, vs in checks.items()]))
    print(f"\n{success} of every seed at the same checkpoints")
    print(seed_table(checks, marks))
    fine = [budget * (k + 1) / 100 for k in range(100)]  # where the crossings are read
    curves = {arm: (fine, [[at(m, window, r) for m in fine] for r in rs]) for arm, rs in runs.items()}
    print()
    for arm, (recurring, turns) in ANCHORS.items():
        print(f"{arm}: anchor states recur for {recurring / max(turns, 1):.0%} of {turns} training turns "
              "(another turn of their group started from the same state)")
    for arm, (wrong_won, won, wrong_lost, lost) in MOVED.items():
        print(f"{arm}: wrong moves are {wrong_won / max(won, 1):.0%} of {won} moves of won training trajectories, "
              f"{wrong_lost / max(lost, 1):.0%} of {lost} of lost ones")
    if not tree:
        print("tree_grpo: waiting for rollout.tree (this tree has no tree rollouts yet)")
    if "grpo" not in curves:
        print("\ntokens to target: the ratios need grpo's runs (here or in --from)")
        return
    target = 0.5 if args.env is None else seed_target(curves["grpo"][1])
    rule = "the ladder's fixed 50%" if args.env is None else (f"the lowest of grpo's {len(runs['grpo'])} seeds' "
                                                              "best (smoothed, within the budget): every grpo seed reaches it")
    print(f"\ntarget: {success} {target:.3f}, {rule}")
    for arm, (grid, vs) in curves.items():
        seeds = " ".join("never" if t is None else f"{t:.0f}"
                         for t in (tokens_to(target, [*zip(grid, v)]) for v in vs))
        reached = mean_tokens_to(target, grid, vs)
        print(f"{arm}: tokens to target per seed {seeds}; seed-mean curve: "
              f"{'never' if reached is None else f'{reached:.0f}'}")
    print(f"\nratios of tokens to target to grpo's [90% interval, {RESAMPLES} seed bootstraps of each arm]")
    for arm in (a for a in ARMS if a != "grpo" and a in curves):
        print(ratio_line(f"{arm}/grpo", *ratio_to_target(target, curves[arm], curves["grpo"])))


if __name__ == "__main__":
    sys.exit(main())
