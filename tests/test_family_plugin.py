"""Day-0 support for a model without a core release: a separate distribution (tests/dists/tick: the
made-up Tick family, with its own call format, chat template, training twin and parser), installed
with pip into a throwaway venv, trains a step on the tiny model carrying Tick's template. And broken
family registrations: each reported against its plugin, none fatal to the other families."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from _dists import make_dist, make_wheel, run_toolrl, venv_over_this_one
from toolrl.families import FamilyError, detect_family, family_named
from toolrl.plugins import Plugins
from toolrl.renderers.families import renderer_factory
from toolrl.templates import trl_template

ROOT = Path(__file__).resolve().parents[1]
TICK = ROOT / "tests" / "dists" / "tick" / "toolrl_tick"


@pytest.fixture(scope="module")
def tick_venv(tmp_path_factory):
    """A venv with toolrl-plugin-tick installed by pip (from its wheel, no index)."""
    root = tmp_path_factory.mktemp("tick")
    wheel = make_wheel(TICK, root, "toolrl-plugin-tick", {"tick": "toolrl_tick"})
    python = venv_over_this_one(root / "venv")
    done = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "--no-cache-dir",
                           "--disable-pip-version-check", "-q", str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return python


def venv_toolrl(python, *args, stdin=None, timeout=120):
    return subprocess.run([str(python), "-m", "toolrl", *args], capture_output=True, text=True, input=stdin,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})


def tick_model(path: Path) -> Path:
    """The tiny random Qwen3 with Tick's chat template (the weights linked, not copied)."""
    from toolrl.model_sources import tiny_qwen3

    path.mkdir()
    for f in Path(tiny_qwen3()).iterdir():
        if f.name != "chat_template.jinja":
            (path / f.name).symlink_to(f)
    shutil.copy(TICK / "tick.jinja", path / "chat_template.jinja")
    return path


@pytest.fixture(scope="module")
def tick_run(tick_venv, tmp_path_factory):
    """One training step in the venv Tick was installed into, with everything Tick ships at once: the
    model carrying its template, its parser and training twin, its estimator, loss, context policy and
    curriculum (a run is most of a test's time; each test below asserts its part on this one)."""
    root = tmp_path_factory.mktemp("tick_run")
    out = root / "run"
    done = venv_toolrl(tick_venv, "train", str(ROOT / "examples" / "tiny.yaml"), f"model.source={tick_model(root / 'model')}",
                       "rollout.parser=tick", "rollout.template_rewrite=training_template",
                       "algorithm.advantage=tick_baseline", "algorithm.advantage_options={baseline: 0.25}",
                       "algorithm.loss=tick_pg", "rollout.context={name: tick_forget, trigger_tokens: 600}",
                       "data.curriculum={name: tick_backwards, skip: 1}",
                       "rollout.n=2", "rollout.max_new_tokens=8", "data.batch_size=1", "trainer.total_steps=1",
                       "trainer.plot=false", "trainer.progress=false", f"trainer.output_dir={out}",
                       "reward.functions=[{name: format, options: {pattern: e}}]",
                       'data.prompt_prefix=[{role: user, content: "What is 1 + 1?"}, '
                       '{role: assistant, content: "<think>one and one</think>2"}]', timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_an_outside_estimator_loss_context_policy_and_curriculum_train_from_the_public_api_alone(tick_run):
    """Tick's estimator, loss, context policy and curriculum import only public paths (check_public_imports),
    and a run that names all four trains a step in the venv it was installed into, on the prompt its
    curriculum drew (the second from the end of the 64), which it was shown."""
    from toolrl.testing import check_public_imports

    assert check_public_imports([TICK]) == []
    row = json.loads((tick_run / "metrics.jsonl").read_text())
    assert row["step"] == 1 and row["grad_norm"] > 0  # the fixed baseline gives every trajectory an advantage
    config = json.loads((tick_run / "config.json").read_text())
    assert (config["algorithm"]["advantage"], config["algorithm"]["loss"]) == ("tick_baseline", "tick_pg")
    assert config["rollout"]["context"]["name"] == "tick_forget"
    assert row["curriculum"]["trajectories_seen"] == 2
    traces = [json.loads(line) for line in (tick_run / "rollouts" / "step_00001.jsonl").read_text().splitlines()]
    assert {t["sample_index"] for t in traces} == {62}


def test_the_installed_family_and_parser_are_listed_with_their_plugin(tick_venv):
    out = venv_toolrl(tick_venv, "list-plugins", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    tick = {r["name"]: r for r in json.loads(out.stdout)}["tick"]
    assert (tick["distribution"], tick["status"]) == ("toolrl-plugin-tick", "ok"), tick["error"]
    assert tick["parts"] == {"tool_parsers": ["tick"], "model_families": ["tick"],
                             "advantage_estimators": ["tick_baseline"], "policy_losses": ["tick_pg"],
                             "context_policies": ["tick_forget"], "curricula": ["tick_backwards"]}
    parsed = venv_toolrl(tick_venv, "parse", "--parser", "tick", "-", stdin='Sure.\nCALL calculator {"expression": "2+3"}')
    assert json.loads(parsed.stdout)["calls"] == [{"name": "calculator", "arguments": {"expression": "2+3"}}]


def test_a_step_trains_with_the_installed_family(tick_run):
    """Tick is detected from the tokenizer's template (byte for byte), its parser reads the turns and
    its training twin renders the prompt: the few-shot turn's reasoning, which Tick's own template
    drops, is in the trained prompt."""
    out = tick_run
    assert json.loads((out / "metrics.jsonl").read_text())["step"] == 1
    traces = [json.loads(line) for line in (out / "rollouts" / "step_00001.jsonl").read_text().splitlines()]
    assert len(traces) == 2
    for t in traces:
        prompt = t["prompt_text"]
        assert prompt.startswith("<|quad_start|>system\n") and "CALL <name> <JSON arguments>" in prompt
        assert "<|quad_start|>assistant\n<think>one and one</think>2<|quad_end|>" in prompt
        assert prompt.endswith("<|quad_start|>assistant\n")


BROKEN = '''
from toolrl import hookimpl
from toolrl.families import Detection, ModelFamily

BOX = ModelFamily(name="box", parser="hermes", end_of_turn="<|box_end|>", detection=Detection(markers=("<|box_start|>",)))

@hookimpl
def register_model_families(register):
    register(BOX)
    # Each of these is wrong; each is reported against this plugin and the others stay usable.
    register(BOX.model_copy(update={"name": "orphan", "parser": "no_such_parser",
                                    "detection": Detection(markers=("<|box_start|>",), priority=99)}))
    register("broken_families:BOX", name="renamed")
    register("broken_families:hookimpl", name="not_a_family")
    register(BOX.model_copy(update={"name": "drawn", "renderer": "broken_families:BOX",
                                    "detection": Detection(markers=("<|box_start|>", "draw"), priority=50)}))
'''


def test_broken_family_registrations_are_reported_against_their_plugin(tmp_path, monkeypatch):
    make_dist(tmp_path, "toolrl-plugin-broken-families", "broken", "broken_families", BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = Plugins(env={"TOOLRL_STRICT_PLUGINS": ""})
    monkeypatch.setattr("toolrl.plugins._plugins", plugins)
    assert "not a toolrl.families.ModelFamily instance" in plugins.info["broken"].error  # at registration
    assert detect_family("<|box_start|>hi").name == "box"  # not orphan, whose parser is missing
    assert detect_family(trl_template("qwen3.jinja")).name == "qwen3"
    with pytest.raises(FamilyError, match=r"^model.chat_format: model family 'orphan' \(plugin 'broken'\) names "
                                          r"tool parser 'no_such_parser', which no plugin registers$"):
        family_named("orphan")
    with pytest.raises(FamilyError, match=r"^model.chat_format: model family 'renamed' \(plugin 'broken'\) is "
                                          r"registered as 'renamed' but named 'box'$"):
        family_named("renamed")
    with pytest.raises(FamilyError, match=r"^model.chat_format: unknown model family 'nope' \(available: box, "):
        family_named("nope")
    info = plugins.info["broken"]
    assert info.status == "error" and "'orphan'" in info.error and "'renamed'" in info.error
    # A renderer reference is resolved when a run uses the family.
    assert detect_family("<|box_start|>draw").name == "drawn"
    with pytest.raises(FamilyError, match=r"^model family 'drawn' \(plugin 'broken'\): renderer 'broken_families:BOX' "
                                          r"is not a toolrl.renderers.chat.ChatRenderer subclass$"):
        renderer_factory(None, "drawn")
    # Listing imports no family; --check loads and checks every one (of the outside plugins only this one's:
    # plugins_vs_core installs them all).
    alone = {"TOOLRL_STRICT_PLUGINS": "", "TOOLRL_LOAD_PLUGINS": "toolrl-plugin-broken-families"}
    for args, listed in ((), False), (("--check",), True):
        out = run_toolrl("list-plugins", "--json", *args, path=tmp_path, env=alone)
        error = {r["name"]: r for r in json.loads(out.stdout)}["broken"]["error"]
        assert ("tool parser 'no_such_parser'" in error) is listed and ("'renamed'" in error) is listed, error


# -- Acme: a family that selects itself -------------------------------------------------------------

ACME = ROOT / "tests" / "dists" / "acme" / "toolrl_acme"


def acme_install(root: Path) -> Path:
    """A venv with toolrl-plugin-acme installed by pip from its wheel (no index, not editable), with a
    plugin cache of its own (``root/cache``, see :func:`acme_run`); returns its python. The cache's built
    models and tokenizers are this process's (linked): building the tiny model and the Qwen3 tokenizer
    again into a fresh cache took 6 s of each test's runs."""
    from toolrl.cache import cache_root

    cache = root / "cache"
    cache.mkdir()
    for built in ("models", "tokenizers"):
        (cache_root() / built).mkdir(parents=True, exist_ok=True)
        (cache / built).symlink_to(cache_root() / built, target_is_directory=True)
    wheel = make_wheel(ACME, root, "toolrl-plugin-acme", {"acme": "toolrl_acme"})
    python = venv_over_this_one(root / "venv")
    done = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "--no-cache-dir",
                           "--disable-pip-version-check", "-q", str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return python


@pytest.fixture(scope="module")
def acme_venv(tmp_path_factory):
    return acme_install(tmp_path_factory.mktemp("acme"))


def acme_run(python, *args, timeout=120):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOOLRL_CACHE": str(Path(python).parents[2] / "cache")}
    return subprocess.run([str(python), *args], capture_output=True, text=True, timeout=timeout, env=env)


SELECTED = """
import sys
from toolrl.config import load_config
from toolrl.rollout.routes import resolve_parts
parser = resolve_parts(load_config(sys.argv[1], sys.argv[2:])).parser
result = parser.parse('Sure. <<call name="calculator">>{"expression": "2+3"}<</call>>')
print(type(parser).__name__, [(c.name, c.arguments) for c in result.calls], repr(result.content))
"""


def test_chat_format_selects_the_familys_parser_unless_rollout_parser_is_set(acme_venv):
    tiny = str(ROOT / "examples" / "tiny.yaml")
    chosen = acme_run(acme_venv, "-c", SELECTED, tiny, "model.chat_format=acme")
    assert chosen.stdout.strip() == "AcmeParser [('calculator', {'expression': '2+3'})] 'Sure.'", chosen.stderr[-2000:]
    explicit = acme_run(acme_venv, "-c", SELECTED, tiny, "model.chat_format=acme", "rollout.parser=hermes")
    assert explicit.stdout.startswith("HermesParser []"), explicit.stderr[-2000:]


@pytest.mark.slow
def test_chat_format_alone_trains_with_the_familys_template(acme_venv, tmp_path):
    """The tiny model's tokenizer carries Qwen3's template; ``model.chat_format: acme`` renders the
    prompts with the template the plugin ships as package data."""
    out = tmp_path / "run"
    done = acme_run(acme_venv, "-m", "toolrl", "train", str(ROOT / "examples" / "tiny.yaml"), "model.chat_format=acme",
                    "rollout.n=2", "rollout.max_new_tokens=8", "data.batch_size=1", "trainer.total_steps=1",
                    "trainer.plot=false", "trainer.progress=false", f"trainer.output_dir={out}", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "metrics.jsonl").read_text())["step"] == 1
    traces = [json.loads(line) for line in (out / "rollouts" / "step_00001.jsonl").read_text().splitlines()]
    assert len(traces) == 2
    for t in traces:
        prompt = t["prompt_text"]
        assert prompt.startswith("<|box_start|>system\n") and 'Call one as <<call name="NAME">>' in prompt
        assert prompt.endswith("<|box_start|>assistant\n") and "<|im_start|>" not in prompt


def test_a_family_token_the_tokenizer_lacks_is_one_line_at_start_and_a_removed_plugin_is_named(tmp_path):
    python = acme_install(tmp_path)
    config = tmp_path / "next.yaml"
    config.write_text((ROOT / "examples" / "tiny.yaml").read_text().replace(
        "  tokenizer: qwen3\n", "  tokenizer: qwen3\n  chat_format: acme_next\n"))
    line = config.read_text().splitlines().index("  chat_format: acme_next") + 1
    args = ("-m", "toolrl", "train", str(config), f"trainer.output_dir={tmp_path / 'run'}")
    done = acme_run(python, *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr == (f"error: {config}:{line}: model.chat_format: model family 'acme_next' (plugin 'acme') needs "
                           "its end-of-turn token '<|acme_turn_end|>', which the tokenizer does not hold as one token\n")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    # Uninstalled, the family's name says which distribution provided it.
    removed = subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "toolrl-plugin-acme"],
                             capture_output=True, text=True)
    assert removed.returncode == 0, removed.stderr
    gone = acme_run(python, *args)
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1, gone.stderr[-3000:]
    assert gone.stderr.startswith(f"error: {config}:{line}: model.chat_format: unknown model family 'acme_next' (")
    assert gone.stderr.endswith("; distribution 'toolrl-plugin-acme' provided it and is not installed "
                                "(pip install toolrl-plugin-acme)\n")
