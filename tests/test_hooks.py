"""Each hook, exercised through a real entry point in a fresh process, plus the documentation contract:
every hook is documented in docs/plugins.md and has a test here named test_hook_<name>."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _dists import make_dist, run_toolrl
from toolrl import hookspecs

ROOT = Path(__file__).resolve().parents[1]
HOOKS = sorted(n for n in dir(hookspecs) if n.startswith("register_") and callable(getattr(hookspecs, n)))

PLUGIN = '''
import click
from toolrl import hookimpl
from toolrl.loggers import Logger
from toolrl.parsers import ToolParser
from toolrl.testing import ScriptedEngine

class Shout(ToolParser):
    name = "shout"
    def parse(self, text):
        from toolrl.schemas import ParseResult, ToolCall
        return ParseResult(content="", calls=[ToolCall(name="shout", arguments={"text": text.upper()})])

class Exact:
    name = "exact"
    def __call__(self, response, ground_truth, **info):
        return float(response.strip() == str(ground_truth))

class Echo(ScriptedEngine):
    name = "echo-engine"

@hookimpl
def register_tool_parsers(register):
    register(Shout)

@hookimpl
def register_tools(register):
    register("hooks_tool:Upper", name="upper")

@hookimpl
def register_reward_functions(register):
    register(Exact)

@hookimpl
def register_rollout_engines(register):
    register(Echo)

class Note(Logger):
    name = "note"
    def open(self, run_dir, config, start_step=0):
        self.path = run_dir / "note.txt"
    def log(self, row, step):
        with open(self.path, "a") as f:
            f.write(f"{step} {row['reward_mean']}\\n")

@hookimpl
def register_loggers(register):
    register(Note)

@hookimpl
def register_environments(register):
    register("hooks_env:SAY", name="say")

from toolrl.algorithms import AdvantageEstimator, LossTerms, PolicyLoss

class MedianBaseline(AdvantageEstimator):
    name = "median_baseline"
    def __call__(self, inputs):
        import torch
        rewards, groups = inputs.rewards, inputs.groups
        adv = torch.stack([r - rewards[groups == g].median() for r, g in zip(rewards, groups)]).float()
        return adv[:, None].expand(inputs.response_mask.shape)

class PlainPG(PolicyLoss):
    name = "plain_pg"
    def __call__(self, inputs):
        import torch
        loss = -inputs.advantages * inputs.new_logprobs
        return LossTerms(loss, torch.zeros_like(loss, dtype=torch.bool))

@hookimpl
def register_advantage_estimators(register):
    register(MedianBaseline)

@hookimpl
def register_policy_losses(register):
    register(PlainPG)

from pydantic import BaseModel, ConfigDict
from toolrl.sessions import EnvironmentSession

class GreeterOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    greeting: str = "Hello."

class Greeter(EnvironmentSession):
    Options = GreeterOptions
    async def respond(self, message):
        return self.options.greeting if message != self.options.greeting else None

@hookimpl
def register_environment_sessions(register):
    register(Greeter, name="greeter")

@hookimpl
def register_model_families(register):
    register("hooks_family:SHOUTY", name="shouty")

from toolrl.context import ContextPlan, ContextPolicy

class ForgetAll(ContextPolicy):
    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        after_turns: int = 8
    def plan(self, view):
        if view.turn < self.options.after_turns:
            return None
        return ContextPlan("forget", list(range(view.task, len(view.messages))), messages=view.messages[:view.task])

@hookimpl
def register_context_policies(register):
    register(ForgetAll, name="forget_all")

from toolrl.transports.disk import DiskTransport

class Spool(DiskTransport):
    """The disk transport under another name: a plugin's transport, its options checked as every part's."""

@hookimpl
def register_weight_transports(register):
    register(Spool, name="spool")

from toolrl.agents import Agent, AgentOptions

class EchoAgent(Agent):
    """A plugin's agent: a program of its own, with an option of its own beside the common ones."""
    class Options(AgentOptions):
        replies: int = 1
    async def run(self, task, endpoint):
        return float(self.options.replies)

@hookimpl
def register_agents(register):
    register(EchoAgent, name="echo")

from toolrl.curricula import Curriculum

class Backwards(Curriculum):
    """A plugin's curriculum: the data read from its end, ``offset`` groups on."""
    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        offset: int = 0
    def choose(self, group):
        return len(self.data.samples) - 1 - (group + self.options.offset) % len(self.data.samples)

@hookimpl
def register_curricula(register):
    register(Backwards, name="backwards")

from toolrl.gateway.protocol import Body, parse_body
from toolrl.gateway.protocols import GatewayProtocol

class Said(Body):
    text: str
    stream: bool = False

class Upper(GatewayProtocol):
    """A plugin's API on the gateway: what is said, in capitals; refusals and its clients' variable its own."""
    path = "upper"
    @staticmethod
    def parse(raw):
        return parse_body(raw, Said)
    @staticmethod
    async def answer(session, req):
        return {"upper": req.text.upper(), "model": session.model}
    @staticmethod
    def error_body(error):
        return {"refused": str(error)}
    @staticmethod
    def environ(root, key):
        return {"UPPER_URL": f"{root}/v1/upper"}

@hookimpl
def register_gateway_protocols(register):
    register(Upper, name="upper")

@hookimpl
def register_commands(cli):
    @cli.command("hello")
    @click.argument("who")
    def hello(who):
        """Say hello."""
        click.echo(f"hello {who}")
'''

TOOL = '''
from toolrl.tools import Tool

class Upper(Tool):
    schema = {"type": "function", "function": {"name": "upper", "description": "Upper-case.",
              "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}

    async def execute(self, instance_id, arguments, **kw):
        return arguments["text"].upper(), 0.0, {}
'''


ENV = '''
from toolrl.environments import Environment

def words(options, split):
    return [{"prompt": f"Say {w}.", "reward_model": {"ground_truth": w}} for w in ("hi", "yo", "hey")[:options.count]]

from pydantic import BaseModel

class Options(BaseModel):
    count: int = 3

SAY = Environment(name="say", description="Say a word.", splits={"train": words}, rewards=[{"name": "exact"}],
                  tools=[{"class_name": "upper"}], metric="exact", options=Options, max_turns=1)
'''


# Turns framed by Qwen's <|box_start|>/<|box_end|> tokens; calls written the way the shout parser reads them.
FAMILY = """
from toolrl.families import Detection, ModelFamily, Template

TEMPLATE = ("{% for m in messages %}<|box_start|>{{ m.role }}: {{ m.content }}<|box_end|>{% endfor %}"
            "{% if add_generation_prompt %}<|box_start|>assistant: {% endif %}")
SHOUTY = ModelFamily(name="shouty", parser="shout", end_of_turn="<|box_end|>",
                     detection=Detection(templates=(Template(jinja=TEMPLATE),), markers=("<|box_start|>", "assistant: ")))
"""


def plugin_dir(tmp_path):
    make_dist(tmp_path, "toolrl-plugin-hooks", "hooks", "hooks_plugin", PLUGIN)
    (tmp_path / "hooks_tool.py").write_text(TOOL)
    (tmp_path / "hooks_env.py").write_text(ENV)
    (tmp_path / "hooks_family.py").write_text(FAMILY)
    return tmp_path


def listed(tmp_path):
    out = run_toolrl("list-plugins", "--json", path=plugin_dir(tmp_path))
    assert out.returncode == 0, out.stderr
    return {r["name"]: r for r in json.loads(out.stdout)}["hooks"]


def python_with_plugin(tmp_path, code):
    """``python -c code`` with the hooks plugin importable (and what this process imports)."""
    path = os.pathsep.join([str(plugin_dir(tmp_path)), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path})


def test_hook_register_tool_parsers(tmp_path):
    assert listed(tmp_path)["parts"]["tool_parsers"] == ["shout"]
    out = run_toolrl("parse", "--parser", "shout", "-", stdin="hi", path=plugin_dir(tmp_path))
    assert json.loads(out.stdout)["calls"] == [{"name": "shout", "arguments": {"text": "HI"}}]


def test_hook_register_tools(tmp_path):
    assert listed(tmp_path)["parts"]["tools"] == ["upper"]
    out = run_toolrl("tool", "call", "upper", '{"text": "abc"}', path=plugin_dir(tmp_path))
    assert out.returncode == 0 and out.stdout.strip() == "ABC"


def test_hook_register_reward_functions(tmp_path):
    assert listed(tmp_path)["parts"]["reward_functions"] == ["exact"]
    code = ("from toolrl.plugins import get_plugins; r = get_plugins().load_part('reward_functions', 'exact')(); "
            "print(r('42', 42), r('41', 42))")
    out = python_with_plugin(tmp_path, code)
    assert out.stdout.split() == ["1.0", "0.0"], out.stderr


def test_hook_register_rollout_engines(tmp_path):
    assert listed(tmp_path)["parts"]["rollout_engines"] == ["echo-engine"]


def test_hook_register_environments(tmp_path):
    assert listed(tmp_path)["parts"]["environments"] == ["say"]
    out = run_toolrl("env", "list", "--json", path=plugin_dir(tmp_path))
    assert out.returncode == 0, out.stderr
    [say] = [r for r in json.loads(out.stdout) if r["name"] == "say"]
    assert say["plugin"] == "hooks" and say["splits"] == {"train": {"source": "generated", "size": 3}}
    assert say["tools"] == ["upper"] and say["rewards"] == {"exact": 1.0} and say["metric"] == "exact"


@pytest.fixture(scope="module")
def plugin_run(tmp_path_factory):
    """One training step that uses the plugin's logger, estimator and loss at once (a run is most of
    a test's time; the logger's output and the estimator's traces are each asserted on it below)."""
    tmp_path = tmp_path_factory.mktemp("plugin_run")
    out = tmp_path / "run"
    done = run_toolrl("train", str(ROOT / "examples" / "tiny.yaml"), "trainer.total_steps=1", "trainer.plot=false",
                      "trainer.progress=false", f"trainer.output_dir={out}", "trainer.loggers=[note]",
                      "algorithm.advantage=median_baseline", "algorithm.loss=plain_pg", path=plugin_dir(tmp_path),
                      env={"OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.mark.slow
def test_hook_register_loggers(tmp_path, plugin_run):
    assert listed(tmp_path)["parts"]["loggers"] == ["note"]
    row = json.loads((plugin_run / "metrics.jsonl").read_text())  # jsonl stays on beside the named logger
    assert (plugin_run / "note.txt").read_text() == f"1 {row['reward_mean']}\n"


@pytest.mark.slow
def test_hook_register_advantage_estimators(tmp_path, plugin_run):
    """A plugin's estimator (and loss) train a run by name; the traces record what it computed."""
    assert listed(tmp_path)["parts"]["advantage_estimators"] == ["median_baseline"]
    traces = [json.loads(x) for x in (plugin_run / "rollouts" / "step_00001.jsonl").read_text().splitlines()]
    for t in traces:
        group = sorted(u["reward"] for u in traces if u["group"] == t["group"])
        assert t["advantage"] == pytest.approx(t["reward"] - group[(len(group) - 1) // 2], abs=1e-6)
    row = json.loads((plugin_run / "metrics.jsonl").read_text())
    assert row["clip_frac"] == 0 and "advantage_mean" in row and "advantages" not in row


def test_hook_register_policy_losses(tmp_path):
    assert listed(tmp_path)["parts"]["policy_losses"] == ["plain_pg"]
    code = ("import torch; from toolrl.config import AlgorithmConfig; from toolrl.algorithms import LossInputs, build_loss; "
            "lp = torch.tensor([[-1.0, -2.0]]); loss = build_loss(AlgorithmConfig(loss='plain_pg')); "
            "print(loss(LossInputs(lp, lp, lp, torch.tensor([[0.5, 0.5]]), torch.ones(1, 2))).per_token.tolist())")
    out = python_with_plugin(tmp_path, code)
    assert out.stdout.strip() == "[[0.5, 1.0]]", out.stderr[-2000:]


def test_hook_register_model_families(tmp_path):
    """The plugin's family is detected from its template (and from its markers), named by
    model.chat_format, and rendered with its end-of-turn token."""
    assert listed(tmp_path)["parts"]["model_families"] == ["shouty"]
    code = ("from hooks_family import TEMPLATE; from toolrl.families import detect_family, family_named; "
            "from toolrl.model_sources import qwen_tokenizer; from toolrl.renderers.families import renderer_factory; "
            "tok = qwen_tokenizer(); tok.chat_template = TEMPLATE; "
            "print(detect_family(TEMPLATE).name, detect_family(TEMPLATE.replace(': ', ':  ')).name, "
            "family_named('shouty').parser, tok.convert_ids_to_tokens(renderer_factory(tok)([]).eos_id))")
    out = python_with_plugin(tmp_path, code)
    assert out.stdout.split() == ["shouty", "shouty", "shout", "<|box_end|>"], out.stderr[-2000:]
def test_hook_register_environment_sessions(tmp_path):
    assert listed(tmp_path)["parts"]["environment_sessions"] == ["greeter"]
    code = ("from toolrl.config import load_config, ConfigError; from toolrl.rollout.routes import session_kind\n"
            "def kind(options):\n"
            "    data = {'data': {'train_files': ['x.jsonl']}, 'session': {'name': 'greeter', 'options': options}}\n"
            "    return session_kind(load_config(None, data=data), None)\n"
            "print(kind({'greeting': 'Hi.'}).options.greeting)\n"
            "try:\n    kind({'greet': 'Hi.'})\nexcept ConfigError as exc:\n    print(exc)\n")
    out = python_with_plugin(tmp_path, code)
    assert out.stdout.splitlines() == ["Hi.", "session.options.greet: unknown key (did you mean 'greeting'?)"], \
        out.stderr[-2000:]


def test_hook_register_context_policies(tmp_path):
    assert listed(tmp_path)["parts"]["context_policies"] == ["forget_all"]
    code = ("from toolrl.config import load_config, ConfigError; from toolrl.rollout.routes import build_context_policy\n"
            "def policy(context):\n"
            "    data = {'data': {'train_files': ['x.jsonl']}, 'rollout': {'context': context}}\n"
            "    return build_context_policy(load_config(None, data=data))\n"
            "print(type(policy({'name': 'forget_all', 'after_turns': 3})).__name__, "
            "policy({'name': 'forget_all', 'after_turns': 3}).options.after_turns)\n"
            "try:\n    policy({'name': 'forget_all', 'after_turn': 3})\nexcept ConfigError as exc:\n    print(exc)\n")
    out = python_with_plugin(tmp_path, code)
    assert out.stdout.splitlines() == ["ForgetAll 3", "rollout.context.after_turn: unknown key (did you mean "
                                       "'after_turns'?)"], out.stderr[-2000:]


def test_hook_register_curricula(tmp_path):
    assert listed(tmp_path)["parts"]["curricula"] == ["backwards"]
    code = ("from toolrl.config import load_config, ConfigError; from toolrl.data.draws import open_draws\n"
            "from toolrl.schemas import Sample\n"
            "def draws(curriculum):\n"
            "    data = {'data': {'train_files': ['x.jsonl'], 'curriculum': curriculum}}\n"
            "    return open_draws(load_config(None, data=data), [Sample(prompt='q', index=i) for i in range(5)])\n"
            "print([draws({'name': 'backwards', 'offset': 1}).prompt(g).index for g in range(3)])\n"
            "try:\n    draws({'name': 'backwards', 'ofset': 1})\nexcept ConfigError as exc:\n    print(exc)\n")
    out = python_with_plugin(tmp_path, code)
    assert out.stdout.splitlines() == ["[3, 2, 1]", "data.curriculum.ofset: unknown key (did you mean 'offset'?)"], \
        out.stderr[-2000:]


def test_hook_register_agents(tmp_path):
    assert listed(tmp_path)["parts"]["agents"] == ["echo"]
    code = ("from toolrl.config import load_config, ConfigError; from toolrl.rollout.routes import build_agent\n"
            "def agent(options):\n"
            "    data = {'data': {'train_files': ['x.jsonl']}, 'rollout': {'agent': options}}\n"
            "    return build_agent(load_config(None, data=data))\n"
            "echo = agent({'name': 'echo', 'replies': 3, 'timeout_s': 9})\n"
            "print(type(echo).__name__, echo.options.replies, echo.options.timeout_s, echo.options.failure)\n"
            "try:\n    agent({'name': 'echo', 'replys': 3})\nexcept ConfigError as exc:\n    print(exc)\n")
    out = python_with_plugin(tmp_path, code)
    assert out.stdout.splitlines() == ["EchoAgent 3 9.0 mask", "rollout.agent.replys: unknown key (did you mean "
                                       "'replies'?)"], out.stderr[-2000:]


def test_hook_register_weight_transports(tmp_path):
    assert listed(tmp_path)["parts"]["weight_transports"] == ["spool"]
    code = ("from toolrl.config import load_config, ConfigError; from toolrl.transports import build_transport\n"
            "def transport(options):\n"
            "    data = {'data': {'train_files': ['x.jsonl']},\n"
            "            'trainer': {'weight_transport': 'spool', 'weight_transport_options': options}}\n"
            "    return build_transport(load_config(None, data=data).trainer)\n"
            "print(type(transport({'path': '/srv/w'})).__name__, transport({'path': '/srv/w'}).options.path)\n"
            "try:\n    transport({'pth': '/srv/w'})\nexcept ConfigError as exc:\n    print(exc)\n")
    out = python_with_plugin(tmp_path, code)
    assert out.stdout.splitlines() == ["Spool /srv/w", "trainer.weight_transport_options.path: Field required; "
                                       "trainer.weight_transport_options.pth: unknown key (did you mean 'path'?)"], \
        out.stderr[-2000:]


def test_hook_register_gateway_protocols(tmp_path):
    assert listed(tmp_path)["parts"]["gateway_protocols"] == ["upper"]
    code = ("import asyncio, aiohttp, json\n"
            "from toolrl.gateway.record import EpisodeRecord\n"
            "from toolrl.gateway.server import Gateway\n"
            "from toolrl.gateway.session import GatewaySession\n"
            "async def main():\n"
            "    gateway = await Gateway().start()\n"
            "    session = gateway.sessions['t0'] = GatewaySession(EpisodeRecord('t0', 0, 0), None, None, None, None, 0, 'm')\n"
            "    print({'chat/completions', 'responses', 'upper'} <= {p.path for p in gateway.protocols})\n"
            "    print(gateway.environ('t0', session.api_key)['UPPER_URL'] == gateway.url('t0') + '/v1/upper')\n"
            "    async with aiohttp.ClientSession() as http:\n"
            "        for body in ({'text': 'hi'}, {'txt': 'hi'}):\n"
            "            async with http.post(gateway.url('t0') + '/v1/upper', json=body,\n"
            "                                 headers={'x-api-key': session.api_key}) as answer:\n"
            "                print(answer.status, json.dumps(await answer.json()))\n"
            "    await gateway.close()\n"
            "asyncio.run(main())\n")
    out = python_with_plugin(tmp_path, code)
    assert out.stdout.splitlines() == ["True", "True",
                                       '200 {"upper": "HI", "model": "m"}', '400 {"refused": "text: Field required"}'], \
        out.stderr[-2000:]


def test_hook_register_commands(tmp_path):
    out = run_toolrl("hello", "world", path=plugin_dir(tmp_path))
    assert out.returncode == 0 and out.stdout.strip() == "hello world"
    assert "register_commands" in listed(tmp_path)["hooks"]


def test_every_hook_is_documented_and_tested():
    docs = (ROOT / "docs" / "plugins.md").read_text()
    tests = (Path(__file__)).read_text()
    for hook in HOOKS:
        params = ", ".join(getattr(hookspecs, hook).__code__.co_varnames[: getattr(hookspecs, hook).__code__.co_argcount])
        assert f"### `{hook}({params})`" in docs, f"docs/plugins.md lacks a section for {hook}({params})"
        assert re.search(rf"^def test_hook_{hook}\(", tests, re.M), f"no test_hook_{hook}"
        assert getattr(hookspecs, hook).__doc__, f"{hook} has no docstring"
