"""Environments: the model, their loaders (files, a local ``datasets`` directory, generators), the
registry checks, config overrides, ``compose.load_samples(config, split)``, and a two-environment
mixture whose samples each get their own tools, turn limit and parser (scripted engine, real
tokenizer, chat template and tools)."""

import json

import pytest
import toolrl.plugins
from _dists import make_dist, run_toolrl
from pydantic import ValidationError
from toolrl.config import ConfigError, load_config
from toolrl.data.sources import load_samples, load_split
from toolrl.environments import Environment, FileSplit, HubSplit
from toolrl.model_sources import model_path
from toolrl.plugins import Plugins
from toolrl.processes.in_process import build_rollouts
from toolrl.rollout.routes import build_routes


def rows(path, *questions, env=None):
    extra = {"env": env} if env else {}
    path.write_text("".join(json.dumps({"prompt": q, "reward_model": {"ground_truth": "1"}, "extra_info": extra})
                            + "\n" for q in questions))
    return path


# -- data splits --------------------------------------------------------------------------------


def test_train_and_test_files_are_separate_splits(tmp_path):
    rows(tmp_path / "train.jsonl", "a", "b")
    rows(tmp_path / "test.jsonl", "c")
    config = load_config(None, data={"data": {"train_files": ["train.jsonl"], "test_files": ["test.jsonl"]},
                                     "base_dir": str(tmp_path)})
    assert [s.prompt[0].content for s in load_samples(config)] == ["a", "b"]
    assert [s.prompt[0].content for s in load_samples(config, "test")] == ["c"]


def test_a_missing_split_is_a_config_error(tmp_path):
    rows(tmp_path / "train.jsonl", "a")
    config = load_config(None, data={"data": {"train_files": ["train.jsonl"]}, "base_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="data.test_files: no test split"):
        load_samples(config, "test")
    with pytest.raises(ConfigError, match="unknown data split 'dev'"):
        load_samples(config, "dev")
    config = load_config(None, data={"data": {"test_files": ["gone.jsonl"]}, "base_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="data.test_files: .*gone.jsonl does not exist"):
        load_samples(config, "test")


# -- the Environment model and its loaders -------------------------------------------------------


def questions(options, split):
    return [{"prompt": f"{split} {i}?", "reward_model": {"ground_truth": str(i)}} for i in range(3)]


def test_environment_validation():
    Environment(name="ok", splits={"train": questions}, rewards=[{"name": "gsm8k"}], metric="gsm8k")
    with pytest.raises(ValidationError, match=r"metric 'exact' is not one of its reward terms .*: gsm8k, bank"):
        Environment(name="x", splits={"train": questions}, rewards=[{"name": "gsm8k"}], session="bank", metric="exact")
    # A session's score is a term of its own (its kind's name), or its parts when it gives them without a total.
    for metric in ("bank", "bank.balance"):
        Environment(name="ok", splits={"train": questions}, session="bank", metric=metric)
    with pytest.raises(ValidationError, match="HubSplit needs a row function"):
        Environment(name="x", splits={"train": HubSplit(path="org/data")})
    with pytest.raises(ValidationError, match="splits.train.callable"):  # FileSplit, HubSplit or callable
        Environment(name="x", splits={"train": "data.jsonl"})
    with pytest.raises(ValidationError, match="name"):
        Environment(name="two words", splits={"train": questions})
    with pytest.raises(ValidationError, match="tools.*class_name"):
        Environment(name="x", splits={"train": questions}, tools=[{"config": {"type": "native"}}])
    with pytest.raises(ValidationError, match="prompt_prefix"):
        Environment(name="x", splits={"train": questions}, prompt_prefix=[{"role": "robot", "content": "hi"}])


def test_eval_metric_may_name_a_sessions_score(tmp_path):
    from toolrl.environments import ConfiguredEnv
    from toolrl.processes.resolve import with_metric

    config = load_config(None, data={"data": {"train_files": ["train.jsonl"]}, "base_dir": str(tmp_path)})
    bank = ConfiguredEnv(Environment(name="b", splits={"train": questions}, session="bank"), None, 1.0, None)
    assert with_metric(config.model_copy(update={"eval": config.eval.model_copy(update={"metric": "bank"})}),
                       {"b": bank}).eval.metric == "bank"
    with pytest.raises(ConfigError, match=r"no reward term 'exact' \(terms: bank, tools, steps\)"):
        with_metric(config.model_copy(update={"eval": config.eval.model_copy(update={"metric": "exact"})}), {"b": bank})


def test_generator_and_file_splits_and_prompt_decoration(tmp_path):
    rows(tmp_path / "held_out.jsonl", "file question")
    env = Environment(name="qa", splits={"train": questions, "test": FileSplit(files=["held_out.jsonl"])},
                      system_prompt="Be exact.", instructions="Answer with a number.",
                      prompt_prefix=[{"role": "user", "content": "1?"}, {"role": "assistant", "content": "1"}])
    train = load_split(env, "train", None, tmp_path)
    assert [s.prompt[0].content for s in train] == ["train 0?", "train 1?", "train 2?"]
    assert all(s.env == "qa" for s in train) and [s.index for s in train] == [0, 1, 2]
    [test] = load_split(env, "test", None, tmp_path)
    assert test.origin == f"{tmp_path / 'held_out.jsonl'}:1" and test.env == "qa"
    with pytest.raises(ConfigError, match="environment 'qa' has no 'dev' split \\(splits: train, test\\)"):
        load_split(env, "dev")


def test_an_environment_without_images_gives_their_text(tmp_path):
    from PIL import Image

    png = tmp_path / "figure.png"
    Image.new("RGB", (8, 8), "white").save(png)
    row = {"prompt": [{"role": "user", "content": [{"type": "text", "text": "Find x in "},
                                                   {"type": "image", "image": str(png)}, {"type": "text", "text": "."}]},
                      {"role": "user", "content": "and <image>?"}],
           "images": [str(png)], "reward_model": {"ground_truth": "1"}}
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    split = {"train": FileSplit(files=["rows.jsonl"])}
    [seen] = load_split(Environment(name="vision", splits=split), "train", None, tmp_path)
    assert len(seen.images) == 2 and seen.prompt[0].content[1] == {"type": "image"}
    [text] = load_split(Environment(name="text", splits=split, images=False), "train", None, tmp_path)
    assert text.images == [] and [m.content for m in text.prompt] == ["Find x in <image>.", "and <image>?"]


def test_options_are_validated_and_configure_adapts_the_environment():
    from pydantic import BaseModel

    class Options(BaseModel, extra="forbid"):
        turns: int = 2
        parser: str = "hermes"

    env = Environment(name="opt", splits={"train": questions}, options=Options,
                      configure=lambda o: {"max_turns": o.turns, "parser": o.parser})
    resolved, options = env.resolve({"turns": 5, "parser": "tags"})
    assert (resolved.max_turns, resolved.parser, options.turns) == (5, "tags", 5)
    with pytest.raises(ConfigError, match="env_options: turnz: unknown key"):
        env.resolve({"turnz": 1})
    with pytest.raises(ConfigError, match="envs.opt.options: environment 'opt': max_turns: Input should be greater"):
        env.resolve({"turns": 0}, "envs.opt.options")
    with pytest.raises(ConfigError, match="environment 'plain' takes no options"):
        Environment(name="plain", splits={"train": questions}).resolve({"x": 1})


def test_hub_split_from_a_local_dataset_directory(tmp_path):
    """A ``datasets`` dataset read offline from a local directory (parquet files per split), each
    record turned into a verl row by the environment's row function."""
    pytest.importorskip("datasets")
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "dataset" / "data"
    data.mkdir(parents=True)
    for split, items in (("train", [("2+2", 4), ("3+3", 6)]), ("test", [("5+5", 10)])):
        pq.write_table(pa.Table.from_pylist([{"question": q, "answer": a} for q, a in items]),
                       data / f"{split}-00000-of-00001.parquet")

    def row(record, options, split):
        return {"prompt": f"What is {record['question']}?", "reward_model": {"ground_truth": str(record["answer"])},
                "extra_info": {"split": split}}

    path = str(tmp_path / "dataset")
    env = Environment(name="sums", splits={s: HubSplit(path=path, split=s) for s in ("train", "test")}, row=row)
    train = load_split(env, "train")
    assert [(s.prompt[0].content, s.ground_truth) for s in train] == [("What is 2+2?", "4"), ("What is 3+3?", "6")]
    [test] = load_split(env, "test")
    assert test.ground_truth == "10" and test.extra_info["split"] == "test" and test.env == "sums"
    broken = Environment(name="b", splits={"train": HubSplit(path=path)}, row=lambda r, o, s: {"prompt": 3})
    with pytest.raises(ConfigError, match=r"dataset train row 1: prompt: Input should be a valid list"):
        load_split(broken, "train")
    missing = Environment(name="m", splits={"train": HubSplit(path=str(tmp_path / "nowhere"))}, row=row)
    with pytest.raises(ConfigError, match="environment 'm' split 'train': cannot load hub .*nowhere"):
        load_split(missing, "train")


# -- plugins: registration checks ------------------------------------------------------------------

TOOLS = '''
from toolrl.tools import Tool

def _schema(name):
    return {"type": "function", "function": {"name": name, "description": name,
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}

class Ping(Tool):
    schema = _schema("ping")
    async def execute(self, instance_id, arguments, **kw):
        return "pong", 0.0, {}

class Echo(Tool):
    schema = _schema("echo")
    async def execute(self, instance_id, arguments, **kw):
        return "echo", 0.0, {}
'''

ENVS = '''
from toolrl import hookimpl
from toolrl.environments import Environment

def numbered(word):
    return lambda options, split: [{"prompt": f"{word} {i}", "reward_model": {"ground_truth": word}}
                                   for i in range(4)]

PING = Environment(name="ping", splits={"train": numbered("ping"), "test": numbered("ping")},
                   tools=[{"class_name": "ping_tools.Ping"}], max_turns=2, rewards=[{"name": "format"}],
                   metric="format")
ECHO = Environment(name="echo", splits={"train": numbered("echo")}, tools=[{"class_name": "ping_tools.Echo"}],
                   max_turns=3, parser="tags",
                   parser_options={"tags": {"echo": {"tool": "echo", "argument": "x"}}})

@hookimpl
def register_environments(register):
    register("mix_envs:PING", name="ping")
    register("mix_envs:ECHO", name="echo")
    register(object(), name="not-an-env")
'''


@pytest.fixture
def mix_plugins(tmp_path, monkeypatch):
    """Plugins with two environments, as the process-wide plugins."""
    make_dist(tmp_path, "toolrl-plugin-mix", "mix", "mix_envs", ENVS)
    (tmp_path / "ping_tools.py").write_text(TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = Plugins(env={})
    monkeypatch.setattr(toolrl.plugins, "_plugins", plugins)
    return plugins


def test_registered_environments_are_checked(mix_plugins):
    info = next(i for i in mix_plugins.list() if i.name == "mix")
    assert info.status == "error" and "not a toolrl.environments.Environment instance" in info.error
    assert {"echo", "ping"} <= set(mix_plugins.registry.names("environments"))
    assert not mix_plugins.registry.has("environments", "not-an-env")
    with pytest.raises(ConfigError, match=r"env: unknown environment 'pong' \(did you mean 'ping'\? available: .*echo.*ping"):
        load_samples(load_config(None, data={"env": "pong"}))


def test_two_plugins_registering_one_environment_name(tmp_path, monkeypatch):
    code = ("from toolrl import hookimpl\nfrom toolrl.environments import Environment\n"
            "E = Environment(name='same', splits={'train': lambda o, s: [{'prompt': 'x'}]})\n"
            "@hookimpl\ndef register_environments(register):\n    register(E)\n")
    make_dist(tmp_path, "toolrl-plugin-one", "one", "env_one", code)
    make_dist(tmp_path, "toolrl-plugin-two", "two", "env_two", code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(toolrl.plugins, "_plugins", Plugins(env={}))
    with pytest.raises(ConfigError, match="environment 'same' is registered by plugins 'one' and 'two'"):
        load_samples(load_config(None, data={"env": "same"}))


# -- config: explicit sections override the environment's -------------------------------------------


def test_explicit_sections_override_the_environment(mix_plugins, tmp_path):
    from toolrl.environments import configured_envs
    from toolrl.rollout.routes import max_turns, parser_spec, resolve_parts

    config = load_config(None, data={"env": "echo", "base_dir": str(tmp_path)})
    echo = configured_envs(config)["echo"]
    assert parser_spec(config, echo.env) == ("tags", {"tags": {"echo": {"tool": "echo", "argument": "x"}}})
    assert max_turns(config, echo) == 3
    config = load_config(None, ["rollout.parser=hermes", "rollout.max_turns=1", "data.system_prompt=Hi.",
                                "reward.functions=[{name: gsm8k}]"], data={"env": "echo", "base_dir": str(tmp_path)})
    assert parser_spec(config, echo.env) == ("hermes", {}) and max_turns(config, echo) == 1
    assert load_samples(config)[0].prompt[0].content == "Hi."
    assert type(resolve_parts(config).parser).__name__ == "HermesParser"
    rows(tmp_path / "mine.jsonl", "own data")
    config = load_config(None, ["data.train_files=[mine.jsonl]"], data={"env": "echo", "base_dir": str(tmp_path)})
    [sample] = load_samples(config)
    assert sample.prompt[0].content == "own data" and sample.env is None  # the single env's route


async def test_explicit_tools_and_rewards_replace_the_environments(mix_plugins, tmp_path):
    config = load_config(None, ["tools.entries=[{class_name: ping_tools.Echo}]", "reward.functions=[]"],
                         data={"env": "ping", "base_dir": str(tmp_path)})
    routes, tools = await build_routes(config)
    try:
        assert list(routes[None].tools) == ["echo"] and routes[None].reward_functions == []
        assert routes["ping"] is routes[None] and routes[None].max_turns == 2
    finally:
        for tool in tools:
            await tool.close()


# -- mixtures ------------------------------------------------------------------------------------------


def test_mixture_samples_follow_the_weights_and_name_their_environment(mix_plugins, tmp_path):
    config = load_config(None, data={"envs": {"ping": {"weight": 3}, "echo": {"weight": 1}}, "base_dir": str(tmp_path)})
    train = load_samples(config)
    assert len(train) == 8 and sorted(s.env for s in train) == ["echo"] * 2 + ["ping"] * 6
    assert [s.index for s in train] == list(range(8))
    assert all(s.prompt[0].content.startswith(s.env) for s in train)
    with pytest.raises(ConfigError, match="environment 'echo' has no 'test' split"):
        load_samples(config, "test")
    rows(tmp_path / "mixed.jsonl", "ping from a file", env="ping")
    rows(tmp_path / "lost.jsonl", "no env")
    config = load_config(None, ["data.train_files=[mixed.jsonl]"],
                         data={"envs": {"ping": {}, "echo": {}}, "base_dir": str(tmp_path)})
    assert [s.env for s in load_samples(config)] == ["ping"]
    config = load_config(None, ["data.train_files=[lost.jsonl]"],
                         data={"envs": {"ping": {}, "echo": {}}, "base_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="lost.jsonl:1: extra_info.env: a mixture needs each sample's environment"):
        load_samples(config)


def call(name):
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{"x": "1"}}}}\n</tool_call>'


async def test_a_mixture_routes_each_sample_to_its_own_tools_turn_limit_and_parser(mix_plugins, tmp_path):
    """ping samples get the ping tool (hermes calls, 2 turns); echo samples the echo tool (inline
    tags, at most 1 turn from envs.echo.max_turns). The model tries both tools in every turn."""
    from toolrl.model_sources import load_tokenizer

    both = call("ping") + call("echo") + "<echo>1</echo>"
    config = load_config(None, ["model.source=tiny-qwen3", "engine.name=scripted",
                                f"engine.options={{script: [{json.dumps(both)}, {json.dumps(both)}, done]}}"],
                         data={"envs": {"ping": {}, "echo": {"max_turns": 1}}, "base_dir": str(tmp_path)})
    samples = load_samples(config)
    path = model_path(config)
    rollouts = await build_rollouts(config, path, load_tokenizer(path), samples=samples)
    try:
        trajs = await rollouts.run(samples, n=1, seed=0)
    finally:
        await rollouts.close()
    tokenizer = load_tokenizer(path)
    by_env = {}
    for t in trajs:
        by_env.setdefault(t.env, []).append(t)
    assert sorted(by_env) == ["echo", "ping"]
    for t in by_env["ping"]:
        assert t.turns == 2 and t.termination == "max_turns"
        assert [(r.name, r.status) for r in t.tool_results] == [("ping", "ok"), ("echo", "unknown_tool")] * 2
        assert '"name": "ping"' in tokenizer.decode(t.prompt_ids) and '"name": "echo"' not in tokenizer.decode(t.prompt_ids)
        assert t.reward_terms["format"] == 1.0  # ping's reward
    for t in by_env["echo"]:
        assert t.turns == 1 and t.termination == "max_turns"
        assert [(r.name, r.status, r.response.text) for r in t.tool_results] == [("echo", "ok", "echo")]
        assert "<tools>" not in tokenizer.decode(t.prompt_ids)  # inline tags: no schemas in the prompt
        assert "format" not in t.reward_terms


def test_env_list_imports_no_torch_and_attributes_the_first_party_environments():
    """Listing imports nothing heavy (with every installed plugin's environments, in plugins_vs_core); with
    the three first-party plugins installed, each environment is listed by its own plugin, and with one
    disabled its environment is absent."""
    out = run_toolrl("env", "list", "--json", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in out.stderr.splitlines() if "|" in line}
    for heavy in ("torch", "transformers", "ray", "vllm", "datasets"):
        assert heavy not in imported, heavy
    for module in ("toolrl_calculator", "toolrl_geo3k", "toolrl_sandbox_fusion"):
        pytest.importorskip(module)
    listed = {r["name"]: r for r in json.loads(out.stdout)}
    assert {listed[n]["plugin"] for n in ("arithmetic", "geo3k", "python-math")} == {
        "calculator", "geo3k", "sandbox-fusion"}
    assert listed["arithmetic"]["plugin"] == "calculator" and listed["python-math"]["plugin"] == "sandbox-fusion"
    # The three plugins alone, two of them disabled (every other installed plugin's listing is the first's).
    out = run_toolrl("env", "list", "--json", env={
        "TOOLRL_LOAD_PLUGINS": "toolrl-plugin-calculator,toolrl-plugin-geo3k,toolrl-plugin-sandbox-fusion",
        "TOOLRL_DISABLE_PLUGINS": "geo3k,calculator"})
    assert {"arithmetic", "geo3k"}.isdisjoint(r["name"] for r in json.loads(out.stdout))
    assert "python-math" in {r["name"] for r in json.loads(out.stdout)}


def test_unknown_env_is_one_line_listing_the_installed_ones(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("env: nope\n")
    out = run_toolrl("rollout", str(config))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith(f"error: {config}:1: env: unknown environment 'nope' (available: ")


@pytest.mark.slow
def test_a_config_of_only_model_and_env_runs_toolrl_rollout(tmp_path):
    """``model: {source: tiny-qwen3}`` + ``env: arithmetic`` (+ small rollout limits) is a whole config:
    the environment brings the data, calculator tool, hermes parser, reward and turn limit."""
    pytest.importorskip("toolrl_calculator")
    config = tmp_path / "arithmetic.yaml"
    config.write_text("model: {source: tiny-qwen3}\nenv: arithmetic\n"
                      "rollout: {n: 2, max_new_tokens: 8, max_response_tokens: 24}\n"
                      f"trainer: {{total_steps: 1, output_dir: {tmp_path / 'out'}, progress: false, plot: false}}\n")
    # `toolrl rollout` in this process (click's runner): the same command, without an interpreter's start.
    from click.testing import CliRunner
    from toolrl.cli import cli

    out = CliRunner().invoke(cli, ["rollout", str(config)])
    assert out.exit_code == 0 and out.exception is None, (out.exception, out.stderr[-3000:])
    traces = [json.loads(line) for line in (tmp_path / "out/rollouts/step_00001.jsonl").read_text().splitlines()]
    assert len(traces) == 4 and {t["env"] for t in traces} == {"arithmetic"}
    assert all("gsm8k" in t["reward_terms"] for t in traces)
    assert "Use the calculator tool" in traces[0]["prompt_text"] and '"name": "calculator"' in traces[0]["prompt_text"]
    # It evaluates without training: one row of figures, no checkpoint.
    assert len((tmp_path / "out/metrics.jsonl").read_text().splitlines()) == 1
    assert not (tmp_path / "out/checkpoints").exists()


def test_an_environment_not_sized_is_listed_without_generating_its_splits_and_counted_by_show():
    from toolrl.cli.env import _describe
    from toolrl.schemas import Sample

    made = []

    def generate(options, split):
        made.append(split)
        return [Sample(prompt=[{"role": "user", "content": "hi"}], ground_truth="x")]

    slow = Environment(name="slow", splits={"train": generate}, sized=False)
    assert _describe("slow", "p", slow)["splits"]["train"] == {"source": "generated", "size": None} and made == []
    assert _describe("slow", "p", slow, count=True)["splits"]["train"]["size"] == 1 and made == ["train"]
    assert _describe("fast", "p", slow.model_copy(update={"sized": True}))["splits"]["train"]["size"] == 1
