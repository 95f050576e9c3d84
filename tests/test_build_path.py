"""One build path: every kind is looked up and built through toolrl.plugins.parts, nothing outside
toolrl/plugins reads the registry, and every unknown name is one line in the same form: the config
field (with the file and line it was written on), the available names and aliases, a "did you mean",
and the distribution that provided it when that one is gone."""

import ast
import importlib
import json
import shutil
from pathlib import Path

import pytest
from _dists import make_dist, run_toolrl
from toolrl.config import ConfigError, load_config
from toolrl.loggers import logger_names
from toolrl.plugins import Plugins
from toolrl.plugins.parts import BuildContext, build_part, namesake_note, registered_part
from toolrl.processes.resolve import resolve_run
from toolrl.rollout.routes import resolve_parts

CORE = Path(__file__).resolve().parents[1] / "core" / "toolrl"
# The registry's state and its errors: what only toolrl/plugins may touch.
REGISTRY_NAMES = {"Registry", "RegistryError", "UnknownPart", "PartError", "Part"}
REGISTRY_ATTRIBUTES = {"registry", "load_part"}


def registry_reads(source: str) -> list[str]:
    """Each registry read in ``source``: an attribute ``.registry``/``.load_part``, or an import of the
    registry module or of its state and errors."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in REGISTRY_ATTRIBUTES:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Import) and any(a.name == "toolrl.plugins.registry" for a in node.names):
            found.append(f"line {node.lineno}: import toolrl.plugins.registry")
        elif isinstance(node, ast.ImportFrom) and node.module == "toolrl.plugins.registry":
            found += [f"line {node.lineno}: {a.name}" for a in node.names if a.name in REGISTRY_NAMES]
        elif isinstance(node, ast.ImportFrom) and node.module == "toolrl.plugins" and any(
                a.name == "registry" for a in node.names):
            found.append(f"line {node.lineno}: from toolrl.plugins import registry")
    return sorted(found, key=lambda f: int(f.split(":")[0].split()[1]))


def test_nothing_outside_the_plugins_package_reads_the_registry():
    reads = {str(f.relative_to(CORE)): registry_reads(f.read_text(encoding="utf-8"))
             for f in sorted(CORE.rglob("*.py")) if "plugins" not in f.relative_to(CORE).parts[:1]}
    assert {f: r for f, r in reads.items() if r} == {}


def test_the_registry_read_check_sees_each_form():
    code = ("from toolrl.plugins import get_plugins, registry\nimport toolrl.plugins.registry\n"
            "from toolrl.plugins.registry import RegistryError, describe_exception\n"
            "get_plugins().registry.get('tools', 'x')\nget_plugins().load_part('tools', 'x')\n")
    assert registry_reads(code) == ["line 1: from toolrl.plugins import registry", "line 2: import toolrl.plugins.registry",
                                    "line 3: RegistryError", "line 4: .registry", "line 5: .load_part"]


CONFIG = """\
model:
  source: tiny-qwen3
  chat_format: {chat_format}
env: arithmetic
engine:
  name: {engine}
rollout:
  parser: {parser}
trainer:
  loggers: [{logger}]
"""
GOOD = {"chat_format": "qwen3", "engine": "transformers", "parser": "hermes", "logger": "jsonl"}


@pytest.mark.parametrize(("field", "value", "line", "message"), [
    ("parser", "qwen4", 8, "rollout.parser: unknown tool parser 'qwen4' (did you mean 'qwen'? available: "),
    ("chat_format", "qwen4", 3, "model.chat_format: unknown model family 'qwen4' (did you mean 'qwen3'? available: "),
    ("engine", "hugging", 6, "engine.name: unknown rollout engine 'hugging' (available: "),
    ("logger", "jsnl", 10, "trainer.loggers: unknown logger 'jsnl' (did you mean 'jsonl'? available: "),
])
def test_an_unknown_name_in_a_file_is_one_line_with_the_file_line_and_every_name(tmp_path, field, value, line,
                                                                                   message):
    path = tmp_path / "run.yaml"
    path.write_text(CONFIG.format(**{**GOOD, field: value}))
    config = load_config(path)
    with pytest.raises(ConfigError) as err:
        resolve_parts(config) if field != "logger" else logger_names(config)
    text = str(err.value)
    assert text.startswith(f"{path}:{line}: {message}") and "\n" not in text, text
    aliases = {"parser": "qwen (= hermes), qwen25 (= hermes)", "engine": "transformers, hf (= transformers))"}
    assert aliases.get(field, "") in text  # the aliases are names too


@pytest.mark.parametrize(("override", "message"), [
    ("rollout.parser=hermez", "rollout.parser: unknown tool parser 'hermez' (did you mean 'hermes'"),
    ("model.chat_format=qwen4", "model.chat_format: unknown model family 'qwen4'"),
    ("rollout.context={name: window, keep_turns: -1}", "rollout.context.keep_turns: Input should be greater than"),
    ("rollout.context={name: windw}", "rollout.context.name: unknown context policy 'windw'"),
    ("trainer.weight_transport=nope", "trainer.weight_transport: unknown weight transport 'nope'"),
    ("session={name: nope}", "session.name: unknown environment session 'nope'"),
    ("env=nope", "env: unknown environment 'nope'"),
])
def test_a_part_set_by_an_override_is_named_by_the_override_and_its_field(override, message):
    """A part's name or options from the command line: the error names the override, as a plain field's does."""
    with pytest.raises(ConfigError) as err:
        resolve_run(load_config(CORE.parents[1] / "examples" / "tiny.yaml", [override]))
    assert str(err.value).startswith(f"override {override}: {message}"), str(err.value)


GONE = """
from toolrl import hookimpl

@hookimpl
def register_tool_parsers(register):
    register("toolrl.parsers.hermes:HermesParser", name="gone_parser", aliases=("gp",))
"""


def test_a_name_whose_distribution_was_removed_says_which(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    make_dist(site, "toolrl-plugin-gone", "gone", "gone_plugin", GONE)
    monkeypatch.syspath_prepend(str(site))
    env = {"TOOLRL_CACHE": str(tmp_path / "cache"), "TOOLRL_LOAD_PLUGINS": "toolrl-plugin-gone"}
    installed = Plugins(env=env)  # screened in a child: the verdict remembers what the distribution provided
    assert registered_part("tool_parsers", "gp", "rollout.parser", installed).name == "gone_parser"
    disabled = Plugins(env={**env, "TOOLRL_DISABLE_PLUGINS": "gone"})
    with pytest.raises(ConfigError, match=r"; its plugin 'gone' \(toolrl-plugin-gone\) is disabled"):
        registered_part("tool_parsers", "gone_parser", "rollout.parser", disabled)
    shutil.rmtree(site / "toolrl_plugin_gone-0.1.0.dist-info")
    importlib.invalidate_caches()
    removed = Plugins(env=env)
    for name in ("gone_parser", "gp"):
        with pytest.raises(ConfigError) as err:
            registered_part("tool_parsers", name, "rollout.parser", removed)
        assert str(err.value).startswith(f"rollout.parser: unknown tool parser {name!r} (")
        assert str(err.value).endswith("; distribution 'toolrl-plugin-gone' provided it and is not installed "
                                       "(pip install toolrl-plugin-gone)")
    with pytest.raises(ConfigError) as err:
        registered_part("tool_parsers", "never_was", "rollout.parser", removed)
    assert "distribution" not in str(err.value)


def test_a_built_in_parts_errors_say_an_outside_plugin_of_its_name_was_refused(tmp_path, monkeypatch,
                                                                                 toolrl_reload_plugins):
    """An outside plugin named like a built-in one (``scripted``, installed before the engine was built in)
    is refused; a run naming the engine gets the built-in's, and its option errors say why."""
    make_dist(tmp_path, "toolrl-plugin-myscript", "scripted", "myscript_plugin", GONE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TOOLRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TOOLRL_LOAD_PLUGINS", "toolrl-plugin-myscript")
    toolrl_reload_plugins()
    with pytest.raises(ConfigError) as err:
        build_part("rollout_engines", "scripted", {"n": 2}, BuildContext("engine.name", "engine.options"))
    assert str(err.value).startswith("engine.options.script: Field required; engine.options.n: unknown key")
    assert str(err.value).endswith("; this is the built-in rollout engine 'scripted': plugin 'scripted' "
                                   "(toolrl-plugin-myscript) was refused (plugin name 'scripted' is already used by "
                                   "toolrl): give its entry point another name")
    assert namesake_note("rollout_engines", "transformers") == ""


def test_list_plugins_columns_align_on_a_long_distribution_name(tmp_path):
    make_dist(tmp_path, "toolrl-plugin-with-a-distribution-name-longer-than-any-column", "long", "long_plugin",
              GONE, version="12.0.0.dev3")
    env = {"TOOLRL_CACHE": str(tmp_path / "cache")}
    rows = json.loads(run_toolrl("list-plugins", "--json", path=tmp_path, env=env).stdout)
    out = run_toolrl("list-plugins", path=tmp_path, env=env)
    lines = [line for line in out.stdout.splitlines() if not line.startswith(" ")]
    assert len(lines) == len(rows)
    columns = set()
    for row, line in zip(rows, lines, strict=True):
        cells = [row["name"], "builtin" if row["builtin"] else row["distribution"], row["version"], row["status"]]
        starts, at = [], 0
        for cell in cells:
            at = line.index(cell, at)
            starts.append(at)
            at += len(cell)
        columns.add(tuple(starts))
    assert len(columns) == 1, columns


SESSION_CONFIG = """\
model:
  source: tiny-qwen3
env: arithmetic
session:
  name: {name}
  options:
    goal: {goal}
"""


@pytest.mark.parametrize(("name", "goal", "line", "message"), [
    ("counter", "many", 6, "session.options.goal: Input should be a valid integer"),
    ("countr", 5, 5, "session.name: unknown environment session 'countr' (did you mean 'counter'? available: "),
])
def test_a_bad_session_in_a_file_is_one_line_with_the_file_line(tmp_path, monkeypatch, name, goal, line, message):
    """Sessions are resolved as every part is: the docs' counter session (a real distribution) named
    in a YAML file with a bad option or a misspelt name."""
    import toolrl.plugins
    from test_scripted_engine import DOCS, fenced

    counter = fenced((DOCS / "plugins.md").read_text(), "python", "class Counter(EnvironmentSession)")
    make_dist(tmp_path, "toolrl-plugin-counter", "counter", "toolrl_counter", counter)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(toolrl.plugins, "_plugins", Plugins(env={}))
    path = tmp_path / "run.yaml"
    path.write_text(SESSION_CONFIG.format(name=name, goal=goal))
    with pytest.raises(ConfigError) as err:
        resolve_parts(load_config(path))
    text = str(err.value)
    assert text.startswith(f"{path}:{line}: {message}") and "\n" not in text, text
