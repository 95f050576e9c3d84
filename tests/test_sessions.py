"""Environment sessions (toolrl.sessions) driven by the rollout loop: a scripted session playing a user
(its turns join the response as mask-0 tokens, exactly the chat template's rendering), tools handed
out at reset (rendered in that trajectory's prompt, or left to the prompt with ``render_tools=False``;
each call a step), ``done`` ending the trajectory, the score as reward terms, and every fault (raise,
hang, junk) contained in its own trajectory with ``close`` always called."""

import asyncio

import pytest
from toolrl.config import ConfigError, RewardConfig, RolloutConfig, load_config
from toolrl.model_sources import qwen_tokenizer
from toolrl.parsers.hermes import HermesParser
from toolrl.parsers.pythonic import PythonicParser
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout import RolloutContext, Route, run_rollouts, run_trajectory
from toolrl.schemas import InfrastructureError, Sample
from toolrl.sessions import EnvironmentSession, Reset, SessionKind, StepResult
from toolrl.testing import ScriptedEngine
from toolrl.tools import Tool

SAMPLE = Sample(prompt=[{"role": "user", "content": "Hi!"}])
THINK = "<think>\n\n</think>\n\n"
TEXTS = [THINK + "How can I help?", THINK + "Let me see.", THINK + "Glad to help."]
LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "Look up.",
                                           "parameters": {"type": "object", "properties": {}}}}


def schema(name):
    return {"type": "function", "function": {"name": name, "description": f"The {name} tool.",
                                             "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}


def call(name, **arguments):
    import json

    return THINK + f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


CLOSED: list[str] = []
HEARD: list[str] = []


class Customer(EnvironmentSession):
    """A simulated user with two replies, then satisfied; scores the conversation with its parts."""

    replies = ["My order is 42.", "Thanks, bye."]

    def __init__(self, options, context):
        super().__init__(options, context)
        self.heard = []

    async def respond(self, message):
        self.heard.append(message)
        HEARD.append(message)
        return self.replies[len(self.heard) - 1] if len(self.heard) <= len(self.replies) else None

    def score(self, trajectory):  # a plain def runs in a thread
        return {"reward": 0.5, "db": 1.0, "heard": len(self.heard)}

    async def close(self):
        CLOSED.append(self.context.trajectory_id)


def ctx(tokenizer, texts, session=None, tools=None, max_turns=8, **config):
    kind = SessionKind(session.__name__.lower(), session, session.Options(), ".") if session else None
    return RolloutContext(engine=ScriptedEngine(tokenizer, texts),
                          renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                          config=RolloutConfig(max_response_tokens=4096, **config),
                          routes={None: Route(tools or {}, max_turns, HermesParser(), [], RewardConfig(), kind)})


@pytest.fixture(scope="module")
def tokenizer():
    return qwen_tokenizer("qwen2_5")


@pytest.fixture(autouse=True)
def _closed():
    CLOSED.clear()
    HEARD.clear()


async def test_user_turns_are_environment_tokens_and_the_score_is_a_term(tokenizer):
    traj = await run_trajectory(ctx(tokenizer, TEXTS, Customer), SAMPLE, 0, "t0", seed=0)
    assert traj.error is None and traj.termination == "answered" and traj.turns == 3
    assert traj.user_turns == Customer.replies
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": TEXTS[0]},
         {"role": "user", "content": Customer.replies[0]}, {"role": "assistant", "content": TEXTS[1]},
         {"role": "user", "content": Customer.replies[1]}, {"role": "assistant", "content": TEXTS[2]}],
        tokenize=False)
    assert tokenizer.decode(traj.prompt_ids + traj.response_ids, skip_special_tokens=False) + "\n" == rendered
    user_ids = [t for t, m in zip(traj.response_ids, traj.response_mask) if not m]
    assert tokenizer.decode(user_ids).count("My order is 42.") == 1 and "Glad" not in tokenizer.decode(user_ids)
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.response_mask) if not m)
    assert traj.reward_terms == {"customer": 0.5} and traj.reward == 0.5
    assert HEARD == TEXTS  # the answers' content, without the end-of-turn token
    assert traj.reward_parts == {"customer.db": 1.0, "customer.heard": 3.0}
    assert CLOSED == ["t0"]


async def test_a_user_turn_past_the_turn_limit_ends_the_trajectory(tokenizer):
    traj = await run_trajectory(ctx(tokenizer, TEXTS, Customer, max_turns=1), SAMPLE, 0, "t0", seed=0)
    assert traj.termination == "max_turns" and traj.turns == 1 and traj.user_turns == Customer.replies[:1]
    assert all(traj.response_mask)  # the reply no generation reads is not appended
    assert CLOSED == ["t0"]


class Broken(Customer):
    async def respond(self, message):
        raise ConnectionError("user endpoint down")

    async def score(self, trajectory):
        return {"db": 1.0}  # without "reward": the parts sum, each its own term


async def test_a_failing_user_is_an_error_not_a_crash(tokenizer):
    traj = await run_trajectory(ctx(tokenizer, TEXTS, Broken), SAMPLE, 0, "t0", seed=0)
    assert traj.termination == "error" and "user endpoint down" in traj.error
    assert traj.reward_terms == {"broken.db": 1.0} and CLOSED == ["t0"]


class Counter(EnvironmentSession):
    """An episode whose tools differ per sample (``extra_info.tools``), each call counted; done at 3."""

    def __init__(self, options, context):
        super().__init__(options, context)
        self.count, self.rewards = 0, []

    async def reset(self, sample):
        names = sample.extra_info["tools"]
        return Reset(tools=[schema(n) for n in names], messages=[{"role": "user", "content": f"Use {names[0]}."}])

    def step(self, call):
        self.count += call.arguments.get("x", 1)
        reward = 1.0 if self.count >= 3 else None
        return StepResult(response=f"{call.name}: {self.count}", reward=reward, done=self.count >= 3)

    async def score(self, trajectory):
        return float(self.count)

    async def close(self):
        CLOSED.append(self.context.trajectory_id)


async def test_tools_per_episode_steps_and_done(tokenizer):
    samples = [Sample(prompt=[{"role": "user", "content": "Go."}], extra_info={"tools": ["add"]}, index=0),
               Sample(prompt=[{"role": "user", "content": "Go."}], extra_info={"tools": ["plus", "more"]}, index=1)]
    scripts = {"s0-": [call("add", x=1), call("add", x=2), call("add", x=5)],
               "s1-": [call("plus", x=1), call("add", x=1), call("more", x=1), THINK + "Done."]}
    context = ctx(tokenizer, scripts, Counter, tools={"lookup": Tool(tool_schema=LOOKUP)}, max_turns=6)
    first, second = await run_rollouts(context, samples, n=1, seed=0)
    # Each trajectory's prompt renders its own tools (the route's, then the reset's) and first message.
    for traj, names in ((first, ["lookup", "add"]), (second, ["lookup", "plus", "more"])):
        prompt = tokenizer.decode(traj.prompt_ids)
        assert prompt == tokenizer.apply_chat_template(
            [{"role": "user", "content": "Go."}, {"role": "user", "content": f"Use {names[1]}."}],
            tools=[LOOKUP, *map(schema, names[1:])], tokenize=False, add_generation_prompt=True)
    # done ends the trajectory after the call that reached it; the step rewards are the trajectory's.
    assert first.termination == "done" and first.turns == 2 and first.error is None
    assert [r.response.text for r in first.tool_results] == ["add: 1", "add: 3"]
    assert first.tool_results[1].metrics == {"done": True}
    assert first.tool_rewards == {"lookup": 0.0}  # the session's tools give no calc_reward
    assert first.reward_terms == {"tools": 0.0, "steps": 1.0, "counter": 3.0}
    # A tool of another episode is unknown here; the model answers before done.
    assert [r.status for r in second.tool_results] == ["ok", "unknown_tool", "ok"]
    assert second.termination == "answered" and second.reward_terms == {"tools": 0.0, "steps": 0.0, "counter": 2.0}
    assert sorted(CLOSED) == [first.trajectory_id, second.trajectory_id]


class Prompted(Counter):
    """A prompted format's episode: its first message describes the ``add`` tool itself, and the reset
    renders tool schemas only when the sample says so (``extra_info.render``)."""

    async def reset(self, sample):
        return Reset(tools=[schema("add")], render_tools=sample.extra_info["render"],
                     messages=[{"role": "user", "content": "Call add(x) as a tool call."}])


async def test_tools_the_template_is_not_given_are_still_the_sessions_steps(tokenizer):
    samples = [Sample(prompt=[{"role": "user", "content": "Go."}], extra_info={"render": r}, index=i)
               for i, r in enumerate([False, True])]
    context = ctx(tokenizer, [call("add", x=1), THINK + "Done."], Prompted, tools={"lookup": Tool(tool_schema=LOOKUP)})
    hidden, shown = await run_rollouts(context, samples, n=1, seed=0)
    messages = [{"role": "user", "content": "Go."}, {"role": "user", "content": "Call add(x) as a tool call."}]
    # render_tools=False: the prompt holds no tool schema, the route's included; the default renders them all.
    assert tokenizer.decode(hidden.prompt_ids) == tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)
    assert "<tools>" not in tokenizer.decode(hidden.prompt_ids) and '"add"' not in tokenizer.decode(hidden.prompt_ids)
    assert tokenizer.decode(shown.prompt_ids) == tokenizer.apply_chat_template(
        messages, tools=[LOOKUP, schema("add")], tokenize=False, add_generation_prompt=True)
    # Either way the call reaches the session's step, and its result is in the trajectory.
    for traj in (hidden, shown):
        assert traj.error is None and traj.termination == "answered" and traj.turns == 2
        assert [(r.name, r.status, r.response.text) for r in traj.tool_results] == [("add", "ok", "add: 1")]
        environment = [t for t, m in zip(traj.response_ids, traj.response_mask) if not m]
        assert "add: 1" in tokenizer.decode(environment)
    assert sorted(CLOSED) == [hidden.trajectory_id, shown.trajectory_id]


async def test_a_parser_reads_the_tools_its_trajectorys_session_handed_out(tokenizer):
    """The route's parser is shared by every trajectory of the route; one whose session hands out tools
    parses with a copy bound to them (a pythonic call's positional argument binds to the handed-out tool's
    parameter), and the route's parser stays unbound."""
    parser = PythonicParser(positional=True)
    kind = SessionKind("counter", Counter, Counter.Options(), ".")
    context = RolloutContext(engine=ScriptedEngine(tokenizer, ["[add(3)]", "Done."]),
                             renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                             config=RolloutConfig(max_response_tokens=4096),
                             routes={None: Route({}, 8, parser, [], RewardConfig(), kind)})
    samples = [Sample(prompt=[{"role": "user", "content": "Go."}], extra_info={"tools": ["add"]}, index=0)]
    (traj,) = await run_rollouts(context, samples, n=1, seed=0)
    assert not traj.parse_errors
    assert [(r.name, r.arguments, r.status) for r in traj.tool_results] == [("add", {"x": 3}, "ok")]
    assert parser.parameters == {}


class Faulty(Counter):
    """A session whose fault is chosen by the sample: in reset, a hang in step, junk from step or score."""

    timeout = 0.5

    async def reset(self, sample):
        self.fault = sample.extra_info["fault"]
        if self.fault == "reset":
            raise RuntimeError("no episode")
        return Reset(tools=[schema("add")])

    async def step(self, call):
        if self.fault == "hang":
            await asyncio.sleep(60)
        return 42 if self.fault == "junk" else StepResult(response="ok")

    async def score(self, trajectory):
        return "high" if self.fault == "score" else 1.0


async def test_faults_stay_in_their_trajectory_and_close_always_runs(tokenizer):
    faults = ["reset", "hang", "junk", "score", "none"]
    samples = [Sample(prompt=[{"role": "user", "content": "Go."}], extra_info={"fault": f}, index=i)
               for i, f in enumerate(faults)]
    context = ctx(tokenizer, [call("add", x=1), THINK + "Done."], Faulty)
    reset, hang, junk, score, fine = await run_rollouts(context, samples, n=1, seed=0)
    assert reset.termination == "error" and "reset: RuntimeError: no episode" in reset.error
    assert reset.reward_terms == {} and not reset.tool_results
    # A failed step ends the trajectory at once (no more generations): a hang is the environment's
    # failure (infra_error, not trained), junk the session's (error).
    assert hang.tool_results[0].status == "timeout" and hang.termination == "infra_error" and hang.turns == 1
    assert "step timed out after 0.5 s" in hang.error
    assert junk.tool_results[0].status == "error" and "StepResult" in junk.tool_results[0].response.text
    assert junk.termination == "error" and junk.turns == 1 and "step: ToolReturnError" in junk.error
    assert score.termination == "answered" and score.reward_terms["faulty"] == 0.0
    assert "must be a number" in score.reward_errors["faulty"] and score.error
    assert fine.error is None and fine.reward_terms == {"steps": 0.0, "faulty": 1.0}
    assert sorted(CLOSED) == sorted(t.trajectory_id for t in (reset, hang, junk, score, fine))


class Slow(Customer):
    async def respond(self, message):
        await asyncio.sleep(60)


async def test_a_cancelled_trajectory_closes_its_session(tokenizer):
    task = asyncio.ensure_future(run_trajectory(ctx(tokenizer, TEXTS, Slow), SAMPLE, 0, "t0", seed=0))
    await asyncio.sleep(1.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert CLOSED == ["t0"]


def test_a_session_kind_is_named_by_the_config_and_its_options_are_checked():
    from toolrl.rollout.routes import session_kind

    with pytest.raises(ConfigError, match="session.name: unknown environment session 'nope'"):
        session_kind(load_config(None, data={"data": {"train_files": ["x.jsonl"]}, "session": {"name": "nope"}}),
                     None)


async def test_a_template_that_cannot_append_a_user_turn_says_so(qwen3_tokenizer):
    # Qwen3's template drops earlier turns' reasoning once the user speaks again.
    traj = await run_trajectory(ctx(qwen3_tokenizer, [THINK.replace("\n\n</think>", "\nhm\n</think>") + "Hi."],
                                    Customer), SAMPLE, 0, "t0", seed=0)
    assert traj.termination == "error" and "not append-only for a user turn" in traj.error, traj.error
    assert CLOSED == ["t0"]


class Dying(Counter):
    """An episode whose server dies at the second step (raised as the infrastructure's failure), or
    whose step raises an ordinary error at the first: either ends the trajectory then."""

    async def reset(self, sample):
        self.fault = sample.extra_info["fault"]
        return Reset(tools=[schema("add")])

    async def step(self, call):
        self.count += 1
        if self.fault == "dead" and self.count == 2:
            raise InfrastructureError("connection to the environment server lost")
        if self.fault == "bug":
            raise KeyError("episode state")
        return StepResult(response=f"add: {self.count}")


async def test_a_failed_session_ends_its_trajectory_at_once(tokenizer):
    samples = [Sample(prompt=[{"role": "user", "content": "Go."}], extra_info={"fault": f}, index=i)
               for i, f in enumerate(["dead", "bug"])]
    engine_calls = [call("add", x=1)] * 6
    dead, bug = await run_rollouts(ctx(tokenizer, engine_calls, Dying, max_turns=6), samples, n=1, seed=0)
    assert dead.termination == "infra_error" and dead.turns == 2, (dead.termination, dead.turns)
    assert [r.status for r in dead.tool_results] == ["ok", "infra_error"]
    assert "connection to the environment server lost" in dead.error
    assert dead.reward_terms.get("dying") is None  # no score for what is not trained
    assert bug.termination == "error" and bug.turns == 1 and "KeyError" in bug.error
    assert bug.reward_terms["dying"] == 1.0  # the session's own bug: scored as before, the model trains on it
    assert sorted(CLOSED) == sorted([dead.trajectory_id, bug.trajectory_id])


class Unreachable(Tool):
    """A tool whose server is unreachable (the infrastructure's failure) when the argument says so,
    and whose ordinary errors are the model's."""

    schema = schema("fetch")

    async def execute(self, instance_id, arguments, **kwargs):
        if arguments.get("x") == 0:
            raise InfrastructureError("sandbox unreachable: connection refused")
        if arguments.get("x") == 1:
            raise ValueError("x must be even")
        return "fetched", 0.0, {}


async def test_a_tool_infrastructure_failure_ends_the_trajectory_and_a_model_error_does_not(tokenizer):
    tools = {"fetch": Unreachable()}
    for x, termination, turns in ((0, "infra_error", 1), (1, "answered", 2)):
        context = ctx(tokenizer, [call("fetch", x=x), THINK + "Done."], tools=tools)
        traj = await run_trajectory(context, SAMPLE, 0, f"t{x}", seed=0)
        assert traj.termination == termination and traj.turns == turns, (x, traj.termination, traj.error)
    assert traj.tool_results[0].status == "error" and "x must be even" in traj.tool_results[0].response.text


class Gone(Customer):
    async def respond(self, message):
        raise InfrastructureError("user simulator endpoint: connection refused")


async def test_a_user_simulator_that_is_gone_is_an_infrastructure_failure_with_no_score(tokenizer):
    traj = await run_trajectory(ctx(tokenizer, TEXTS, Gone), SAMPLE, 0, "t0", seed=0)
    assert traj.termination == "infra_error" and "connection refused" in traj.error and traj.turns == 1
    assert traj.reward_terms == {} and CLOSED == ["t0"]
