"""Tree rollouts (``rollout.tree``, toolrl.rollout.tree): clones of a line's trajectory, engine KV,
environment session and tools; leaf counts, ids, seeds and split points; the refusal of parts that
cannot clone; exactness against the same leaves run as flat trajectories on the transformers engine,
with the shared prefix prefilled once; and the trainer's packing of a tree."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from pydantic import ValidationError
from test_run_check import refused
from toolrl.config import RewardConfig, RolloutConfig, TreeConfig
from toolrl.engines import ModelSource
from toolrl.engines.transformers import TransformersEngine
from toolrl.model_sources import load_model, qwen_tokenizer
from toolrl.parsers.hermes import HermesParser
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout import RolloutContext, Route, run_rollouts
from toolrl.rollout.episode import Tree, TreeLine, start_episode
from toolrl.rollout.loop import finish_tools, take_turn
from toolrl.rollout.tree import clone_line
from toolrl.schemas import Sample
from toolrl.seeds import continuation_seed, trajectory_seed
from toolrl.sessions import EnvironmentSession, Reset, SessionKind, StepResult
from toolrl.testing import ScriptedEngine
from toolrl.tools import Tool
from toolrl.training.microbatch import plan
from toolrl.training.packing import build_batch, input_tokens
from toolrl.training.prefix_tree import layout
from toolrl.training.step import response_logprobs
from toolrl.trajectory import Trajectory

PROMPT = [Sample(prompt=[{"role": "user", "content": "Count the steps."}], index=0)]


def call(**args):
    return "<tool_call>\n" + json.dumps({"name": "step", "arguments": args}) + "\n</tool_call>"


class Steps(EnvironmentSession):
    """Hands out ``step``; its state is the calls it saw; scored by how many. Clones by copying them."""

    STEP = {"type": "function", "function": {"name": "step", "description": "Take a step.", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}

    async def reset(self, sample):
        self.seen = []
        return Reset(tools=[self.STEP])

    def step(self, call):
        self.seen.append(call.arguments["n"])
        return StepResult(response=f"seen {self.seen}")

    async def score(self, trajectory):
        return float(len(self.seen))

    async def clone(self):
        twin = Steps(self.options, self.context)
        twin.seen = list(self.seen)
        return twin


class Stuck(Steps):
    async def clone(self):
        raise RuntimeError("no copy of this world")


class Tally(Tool):
    """State where the default lifecycle keeps it (``self.state``): clones by the default's deep copy."""

    schema = {"type": "function", "function": {"name": "tally", "description": "Count.", "parameters": {
        "type": "object", "properties": {}}}}

    async def execute(self, instance_id, arguments, **kw):
        self.state(instance_id).setdefault("calls", []).append(1)
        return "ok", 0.0, {}

    async def calc_reward(self, instance_id, **kw):
        return float(len(self.state(instance_id).get("calls", [])))


class Remote(Tally):
    async def create(self, instance_id=None, **kw):  # state it would keep elsewhere
        return await super().create(instance_id, **kw)


class Scripted(ScriptedEngine):
    """Each continuation calls ``step`` with its own id's last digit, so the leaves' states differ."""

    def text(self, session_id, prompt_ids):
        turn = self.turns.get(session_id, 0)
        self.turns[session_id] = turn + 1
        digit = int(session_id[-1]) if session_id[-2] == "." else 0
        return call(n=10 * turn + digit) if turn < 3 else "Done."


def scripted_context(session=Steps, tools=None, **tree):
    tokenizer = qwen_tokenizer("qwen2_5")
    tree = TreeConfig(**tree)
    config = RolloutConfig(n=2 * tree.leaves, max_response_tokens=2048, tree=tree)
    kind = SessionKind(session.__name__.lower(), session, session.Options(), ".")
    return RolloutContext(engine=Scripted(tokenizer, []), renderer_factory=lambda s: ChatRenderer(tokenizer, s),
                          config=config, routes={None: Route(tools or {}, 8, HermesParser(), [], RewardConfig(), kind)})


def test_a_group_holds_n_leaves_of_n_over_width_to_the_depth_trees():
    ctx = scripted_context(width=2, depth=2, turn=1)
    trajs = asyncio.run(run_rollouts(ctx, PROMPT, n=8, seed=5))
    assert [t.trajectory_id for t in trajs] == [f"s0-g0-{k}{p}" for k in (0, 1) for p in ("", ".0.1", ".1", ".1.1")]
    assert [t.tree_id for t in trajs] == [0] * 4 + [1] * 4
    # The calls each leaf's session saw: turn 0 shared (n=0), then 10 * turn + its id's last digit (a
    # line that goes on keeps its id).
    assert [t.reward for t in trajs[:4]] == [3.0] * 4
    assert [t.termination for t in trajs] == ["answered"] * 8
    texts = [ctx.engine.tokenizer.decode(t.response_ids) for t in trajs[:4]]
    for text, ns in zip(texts, [(0, 10, 20), (0, 10, 21), (0, 11, 21), (0, 11, 21)]):
        assert f"seen {list(ns)}" in text
    # Each leaf's split point: its latest split, where its tokens left its line's.
    first, second = (trajs[0].turn_starts[t] for t in (1, 2))
    assert [t.split_point for t in trajs[:4]] == [second] * 4
    assert all(t.response_ids[:first] == trajs[0].response_ids[:first] for t in trajs[:4])
    # The engine session is cloned with the line: one clone per line per depth.
    assert ctx.engine.cloned[:2] == [("s0-g0-0", ["s0-g0-0.1"]), ("s0-g0-1", ["s0-g0-1.1"])]
    assert len(ctx.engine.cloned) == 2 * 3


def test_a_clone_holds_copies_of_its_lines_lists():
    """Each continuation has its own trajectory, conversation, pieces, step rewards and session terms:
    what one line appends leaves its line and its siblings as they were; only the tree is shared."""

    async def lines():
        ctx = scripted_context(width=3, depth=1, turn=1)
        root = await start_episode(ctx, ctx.route_for(PROMPT[0]), PROMPT[0], 0, "s0-g0-0", 1)
        root.line = TreeLine(Tree())
        root.closed.append(Trajectory(trajectory_id="s0-g0-0~0", trajectory_key="s0-g0-0", sample_index=0, group=0,
                                      prompt_ids=[1], response_ids=[2], response_mask=[1]))
        root.step_rewards.append(0.5)
        root.session_terms["steps"] = 1.0
        clones = [await clone_line(root, root.line, c) for c in (1, 2)]
        for ep in clones:
            await finish_tools(ep)
        await finish_tools(root)
        return root, *clones

    root, one, two = asyncio.run(lines())
    assert [e.traj.trajectory_id for e in (root, one, two)] == ["s0-g0-0", "s0-g0-0.1", "s0-g0-0.2"]
    assert [e.closed[0].trajectory_id for e in (one, two)] == ["s0-g0-0.1~0", "s0-g0-0.2~0"]
    assert one.line.tree is root.line.tree and one.line.path == (1,) and two.line.path == (2,)

    def state(e):
        return json.dumps([e.traj.model_dump(mode="json"), e.messages, e.step_rewards, e.session_terms,
                           [p.model_dump(mode="json") for p in e.closed]])

    before = [state(root), state(two)]
    one.traj.response_ids.append(9)
    one.traj.turn_starts.append(0)
    one.messages.append({"role": "user", "content": "only mine"})
    one.messages[0]["content"] = "changed"
    one.step_rewards.append(1.0)
    one.session_terms["steps"] = 5.0
    one.closed[0].response_ids.append(9)
    one.closed.append(one.closed[0])
    assert [state(root), state(two)] == before


def test_a_tool_instance_is_cloned_with_its_state():
    tools = {"tally": Tally()}
    ctx = scripted_context(tools=tools, width=3, depth=1, turn=2)
    trajs = asyncio.run(run_rollouts(ctx, PROMPT, n=3, seed=0))
    assert len(trajs) == 3 and all(t.termination == "answered" for t in trajs)
    assert [t.tool_rewards for t in trajs] == [{"tally": 0.0}] * 3  # created, cloned, each released
    assert tools["tally"]._instances == {}


def test_a_tool_that_cannot_clone_is_unavailable_in_the_clones_only():
    """What the run check cannot see (a tool a session hands out) is refused at the split: the clone's
    calls to it are errors the model reads, and the tool's error is the copy's."""
    tools = {"tally": Remote()}
    trajs = asyncio.run(run_rollouts(scripted_context(tools=tools, width=2, depth=1, turn=1), PROMPT, n=2, seed=0))
    assert trajs[0].error is None and trajs[0].tool_rewards == {"tally": 0.0}
    assert trajs[1].tool_errors == {"tally": "clone: the tool cannot clone its state (Tool.clone)"}
    assert tools["tally"]._instances == {}


def test_continuations_sample_apart_and_reproducibly():
    seeds = {continuation_seed(trajectory_seed(7, 0, 0), turn, c) for turn in (1, 2) for c in range(4)}
    assert len(seeds) == 7  # continuation 0 keeps its line's seed at any turn
    assert continuation_seed(100, 1, 0) == 100 and continuation_seed(100, 1, 2) == continuation_seed(100, 1, 2) != continuation_seed(100, 2, 2)


def test_a_session_whose_clone_fails_ends_that_continuation_only():
    trajs = asyncio.run(run_rollouts(scripted_context(session=Stuck, width=2, depth=1, turn=1), PROMPT, n=2, seed=0))
    assert trajs[0].termination == "answered"
    assert trajs[1].termination == "error" and "session 'stuck' clone: RuntimeError: no copy of this world" in trajs[1].error


def test_a_line_that_ends_before_its_splits_is_made_up_for_from_the_prompt():
    """The lines answer at turn 3: a split at turn 5 never comes, so each tree's other leaves start
    afresh (sharing the prompt only), and the group still holds n."""
    ctx = scripted_context(width=2, depth=2, turn=5)
    trajs = asyncio.run(run_rollouts(ctx, PROMPT, n=8, seed=0))
    assert [(t.trajectory_id, t.tree_id, t.split_point) for t in trajs] == [
        (f"s0-g0-{k}{leaf}", k, None if leaf == "" else 0) for k in (0, 1) for leaf in ("", ".r1", ".r2", ".r3")]
    assert all(t.termination == "answered" and t.reward == 3.0 for t in trajs)
    # Splits due before turns 3 and 4: the lines answer at turn 3, so each of the first split's two
    # continuations is one leaf short, made up after it.
    ctx = scripted_context(width=2, depth=2, turn=3)
    trajs = asyncio.run(run_rollouts(ctx, PROMPT, n=4, seed=0))
    assert [(t.trajectory_id, t.split_point) for t in trajs] == [
        ("s0-g0-0", trajs[0].turn_starts[3]), ("s0-g0-0.r1", 0), ("s0-g0-0.1", trajs[0].turn_starts[3]),
        ("s0-g0-0.1.r1", 0)]


def test_a_call_trees_do_not_divide_runs_flat():
    trajs = asyncio.run(run_rollouts(scripted_context(width=2, depth=1, turn=1), PROMPT, n=3, seed=0))
    assert [t.tree_id for t in trajs] == [None] * 3


def test_the_config_needs_whole_trees():
    with pytest.raises(ValidationError, match="4 leaves per tree must divide rollout.n=6"):
        RolloutConfig(n=6, tree={"width": 2, "depth": 2})
    assert RolloutConfig(n=8, tree={}).tree.leaves == 4


def test_what_cannot_clone_says_so():
    assert Tally.can_clone() and not Remote.can_clone()
    assert Steps.can_clone() and not EnvironmentSession.can_clone()


def test_a_session_kind_that_cannot_clone_is_refused_before_weights_load(tmp_path, monkeypatch,
                                                                        toolrl_reload_plugins):
    # A kind whose sessions live elsewhere (it overrides no clone), installed as a plugin's.
    from _dists import load_plugin

    load_plugin(tmp_path, monkeypatch, toolrl_reload_plugins, "toolrl-plugin-far", "far", "far_session",
                "from toolrl import hookimpl\nfrom toolrl.sessions import EnvironmentSession\n\n\n"
                "class Far(EnvironmentSession):\n    pass\n\n\n@hookimpl\ndef register_environment_sessions(register):\n"
                "    register(Far, name=\"far\")\n")
    line, _ = refused(tmp_path, "rollout.tree", "session 'far'", "cannot clone", session={"name": "far"},
                      rollout={"n": 2, "tree": {"width": 2, "depth": 1}})
    assert line.count("\n") == 0


# -- exactness on the transformers engine -------------------------------------------------------------


class User(Steps):
    """A simulated user who asks for more twice: the tiny model's turns, three per trajectory."""

    async def reset(self, sample):
        self.seen = []
        return Reset()

    async def respond(self, message):
        self.seen.append(message)
        return f"Go on ({len(self.seen)})." if len(self.seen) < 3 else None

    async def clone(self):
        twin = User(self.options, self.context)
        twin.seen = list(self.seen)
        return twin


@pytest.fixture(scope="module")
def tokenizer():
    """Qwen2.5's template: append-only for user turns (Qwen3's drops earlier turns' thinking)."""
    return qwen_tokenizer("qwen2_5")


@pytest.fixture(scope="module")
def model(tiny_qwen3_path, tokenizer):
    """The tiny random model, its end-of-turn logit raised (an lm_head bias) so that turns end."""
    m = load_model(tiny_qwen3_path)
    bias = torch.zeros(m.config.vocab_size)
    bias[tokenizer.convert_tokens_to_ids("<|im_end|>")] = 10.0
    m.lm_head.register_forward_hook(lambda module, args, out: out + bias)
    return m


def engine_context(path, model, tokenizer, tree, **options):
    engine = TransformersEngine.create(ModelSource(path=path, module=model, tokenizer=tokenizer),
                                       {"device": "cpu", **options})
    config = RolloutConfig(n=tree.leaves if tree else 1, max_new_tokens=24, max_response_tokens=1024, tree=tree)
    kind = SessionKind("user", User, User.Options(), ".")
    return RolloutContext(engine=engine, renderer_factory=lambda s: ChatRenderer(tokenizer, s), config=config,
                          routes={None: Route({}, 8, HermesParser(), [], RewardConfig(), kind)})


async def replay(ctx, leaf, tree, seed):
    """``leaf`` generated as a flat trajectory: its own engine session, its seed changed at each split turn
    as the leaf's path says (its id's suffix)."""
    path = [int(c) for c in leaf.trajectory_id.split("-")[-1].split(".")[1:]]
    path += [0] * (tree.depth - len(path))
    ep = await start_episode(ctx, ctx.route_for(PROMPT[0]), PROMPT[0], 0, "flat", seed)
    ending = None
    while ending is None:
        depth = ep.traj.turns - tree.turn
        if 0 <= depth < tree.depth:
            ep.seed = continuation_seed(ep.seed, ep.traj.turns, path[depth])
        ending = await take_turn(ep)
    await finish_tools(ep)
    return ep.traj


async def tree_and_flat(path, model, tokenizer, **options):
    """A tree (width 2, depth 2: four leaves) and its leaves replayed flat, one after another, each on an
    engine of its own with ``options``; the engines' stats."""
    tree = TreeConfig(width=2, depth=2, turn=1)
    ctx = engine_context(path, model, tokenizer, tree, **options)
    leaves = await run_rollouts(ctx, PROMPT, n=tree.leaves, seed=3)
    await ctx.engine.close()
    flat_ctx = engine_context(path, model, tokenizer, None, **options)
    flat = [await replay(flat_ctx, leaf, tree, trajectory_seed(3, 0, 0)) for leaf in leaves]
    await flat_ctx.engine.close()
    return leaves, flat, ctx.engine.stats, flat_ctx.engine.stats


@pytest.fixture(scope="module")
def solo(tiny_qwen3_path, model, tokenizer):
    """One row at a time (max_batch_size 1): every computation has the shapes it has flat."""
    return asyncio.run(tree_and_flat(tiny_qwen3_path, model, tokenizer, max_batch_size=1))


@pytest.fixture(scope="module")
def batched(tiny_qwen3_path, model, tokenizer):
    return asyncio.run(tree_and_flat(tiny_qwen3_path, model, tokenizer))


def assert_leaves_are_flat(leaves, flat, exact):
    assert len(leaves) == 4 and len({tuple(t.response_ids) for t in leaves}) == 4
    assert all(t.turns == 3 and t.termination == "answered" for t in leaves)
    for tree_leaf, flat_leaf in zip(leaves, flat):
        assert tree_leaf.prompt_ids == flat_leaf.prompt_ids
        assert tree_leaf.response_ids == flat_leaf.response_ids
        assert tree_leaf.response_mask == flat_leaf.response_mask
        if exact:
            assert tree_leaf.logprobs == flat_leaf.logprobs  # floats compared exactly
        else:
            torch.testing.assert_close(tree_leaf.logprobs, flat_leaf.logprobs, rtol=0, atol=1e-5)


def test_a_trees_leaves_are_generated_flat_bit_for_bit(solo):
    assert_leaves_are_flat(*solo[:2], exact=True)


def test_batched_the_leaves_are_the_flat_ones_within_float_rounding(batched):
    """Batched, a row's attention and matmuls run beside other rows (the tree's continuations decode
    together), which sums in another order: the tokens are the same, the logprobs within 1e-5, as
    the engine's batched rows are against solo ones (tests/test_transformers_engine.py)."""
    assert_leaves_are_flat(*batched[:2], exact=False)


def new_tokens(t, k):
    """The tokens turn ``k`` (from 1) of ``t`` prefills on the KV its line kept: the last token
    generated before it (never fed) and the observation after it."""
    mask = t.response_mask[: t.turn_starts[k]]
    return len(mask) - max(i for i, m in enumerate(mask) if m)


def test_the_shared_prefix_is_prefilled_once(batched):
    """Flat, each leaf prefills its prompt and each turn's new tokens; the tree prefills the prompt
    once and each turn's new tokens once per distinct line: the continuations of a split reuse the
    line's KV (clone_session) and prefill their first turn's new tokens together."""
    leaves, _, tree_stats, flat_stats = batched
    prompt = len(leaves[0].prompt_ids)
    assert flat_stats.prefilled_tokens == sum(prompt + new_tokens(t, 1) + new_tokens(t, 2) for t in leaves)
    lines = {k: {tuple(t.response_ids[: t.turn_starts[k]]): t for t in leaves} for k in (1, 2)}
    assert [len(lines[k]) for k in (1, 2)] == [1, 2]
    assert tree_stats.prefilled_tokens == prompt + sum(new_tokens(t, k) for k in (1, 2) for t in lines[k].values())
    assert tree_stats.generated_tokens == len(set().union(*(
        {tuple(t.response_ids[: i + 1]) for i, m in enumerate(t.response_mask) if m} for t in leaves)))
    assert flat_stats.generated_tokens == sum(map(sum, (t.response_mask for t in leaves)))


def test_the_trainer_packs_a_tree_once_per_shared_token(batched):
    leaves = batched[0]
    seqs = [input_tokens(t) for t in leaves]
    assert len(layout(seqs).ids) == len({tuple(s[: i + 1]) for s in seqs for i in range(len(s))})
    # The plan keeps a tree's leaves in one micro-batch whenever they fit.
    assert plan(range(4), [len(s) for s in seqs], 1, 4, seqs=seqs) == [[[0, 1, 2, 3]]]


def test_the_trainers_logprobs_of_a_packed_tree_equal_the_unshared(batched, model):
    leaves = batched[0]
    with torch.no_grad():
        shared = response_logprobs(model, build_batch(leaves, [0.0] * 4, share_prefixes=True))
        unshared = response_logprobs(model, build_batch(leaves, [0.0] * 4, share_prefixes=False))
    # Not bit for bit: the packed tree attends over another layout (spans and masks), which sums in
    # another order; within float32 rounding of the tiny model's logits.
    torch.testing.assert_close(shared, unshared, rtol=0, atol=1e-5)


def test_a_route_whose_session_and_tools_clone_passes_the_check(tmp_path):
    from test_run_check import passes_with

    assert passes_with(tmp_path, rollout={"n": 4, "tree": {"width": 2, "depth": 2}}) == []


def test_trees_that_do_not_divide_n_are_one_line(tmp_path):
    refused(tmp_path, "rollout.tree", "4 leaves per tree must divide rollout.n=6", rollout={"n": 6, "tree": {"width": 4, "depth": 1}})


@pytest.mark.parametrize(("entry", "why"), [
    ({"class_name": "test_tree_rollouts.Remote"}, "defines no Tool.clone"),
    ({"class_name": "calculator", "config": {"isolation": "process"}}, "it runs in a worker process")])
def test_a_tool_that_cannot_clone_is_refused_before_weights_load(tmp_path, entry, why):
    refused(tmp_path, "rollout.tree", "cannot clone its per-trajectory state", why, tools={"entries": [entry]},
            rollout={"n": 2, "tree": {"width": 2, "depth": 1}})
