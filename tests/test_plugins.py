import json

import pytest
from _dists import GOOD_PLUGIN, GOOD_TOOL_IMPL, make_dist, run_toolrl
from toolrl.plugins import PluginLoadError, Plugins
from toolrl.plugins.registry import RegistryError


@pytest.fixture
def dists(tmp_path, monkeypatch):
    make_dist(tmp_path, "toolrl-plugin-good", "good", "good_plugin", GOOD_PLUGIN)
    (tmp_path / "good_tool_impl.py").write_text(GOOD_TOOL_IMPL)
    make_dist(tmp_path, "toolrl-plugin-broken", "broken", "broken_plugin", "import this_module_does_not_exist\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def by_name(plugins):
    return {i.name: i for i in plugins.list()}


def test_builtins_register_through_hooks():
    info = by_name(Plugins(env={}))
    assert info["hermes"].builtin and info["hermes"].status == "ok"
    assert info["hermes"].parts == {"tool_parsers": ["hermes"]}
    assert info["rewards"].parts["reward_functions"] == ["gsm8k", "math", "format"]
    assert info["transformers"].hooks == ["register_rollout_engines"]


def test_broken_plugin_is_reported_not_fatal(dists):
    plugins = Plugins(env={})
    info = by_name(plugins)
    assert info["broken"].status == "error"
    assert "this_module_does_not_exist" in info["broken"].error
    assert info["good"].status == "ok" and info["good"].distribution == "toolrl-plugin-good"
    assert plugins.registry.get("tools", "echo").plugin == "good"


def test_strict_mode_makes_errors_fatal(dists):
    with pytest.raises(PluginLoadError, match="broken"):
        Plugins(env={"TOOLRL_STRICT_PLUGINS": "1"})


def test_allow_list_and_disable(dists):
    info = by_name(Plugins(env={"TOOLRL_LOAD_PLUGINS": "toolrl-plugin-good"}))
    assert info["good"].status == "ok" and info["broken"].status == "disabled"
    info = by_name(Plugins(env={"TOOLRL_LOAD_PLUGINS": ""}))
    assert info["good"].status == "disabled" and info["hermes"].status == "ok"
    plugins = Plugins(env={"TOOLRL_DISABLE_PLUGINS": "hermes,toolrl-plugin-broken"})
    info = by_name(plugins)
    assert info["hermes"].status == "disabled" and info["broken"].status == "disabled"
    with pytest.raises(RegistryError, match="unknown tool parser 'hermes'"):
        plugins.registry.get("tool_parsers", "hermes")


def test_two_plugins_registering_one_name_is_an_error_naming_both(tmp_path, monkeypatch):
    code = GOOD_PLUGIN.replace("good_tool_impl", "good_tool_impl")
    make_dist(tmp_path, "toolrl-plugin-a", "a", "plugin_a", code)
    make_dist(tmp_path, "toolrl-plugin-b", "b", "plugin_b", code)
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = Plugins(env={})
    info = by_name(plugins)
    assert info["b"].status == "error" and "'a' and 'b'" in info["b"].error
    with pytest.raises(RegistryError, match="'a' and 'b'"):
        plugins.registry.get("tools", "echo")


def test_unknown_names_list_the_choices():
    with pytest.raises(RegistryError, match=r"available: .*hermes.*tags"):
        Plugins(env={}).registry.get("tool_parsers", "nope")


def test_list_plugins_cli_with_a_broken_plugin(dists):
    lenient = {"TOOLRL_STRICT_PLUGINS": ""}  # nox's plugins_vs_core runs strict
    out = run_toolrl("list-plugins", "--json", path=dists, env=lenient)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows["broken"]["status"] == "error" and rows["good"]["status"] == "ok"
    assert rows["good"]["version"] == "0.1.0" and rows["good"]["hooks"] == ["register_tools"]
    called = run_toolrl("tool", "call", "echo", '{"text": "hi"}', path=dists, env=lenient)
    assert called.returncode == 0 and called.stdout.strip() == "hi"


def test_list_plugins_does_not_import_heavy_libraries():
    out = run_toolrl("list-plugins", "--json", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert out.returncode == 0
    imported = {line.split("|")[-1].strip().split(".")[0] for line in out.stderr.splitlines() if "|" in line}
    for heavy in ("torch", "transformers", "ray", "vllm", "mcp", "httpx", "pydantic", "jsonschema"):
        assert heavy not in imported, heavy


def test_hook_errors_inside_register_are_isolated(tmp_path, monkeypatch):
    make_dist(tmp_path, "toolrl-plugin-bad-hook", "badhook", "bad_hook",
              "from toolrl import hookimpl\n@hookimpl\ndef register_tools(register):\n    raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    info = by_name(Plugins(env={}))
    assert info["badhook"].status == "error" and "boom" in info["badhook"].error


BAD_PARTS = {
    # (entry, module code): each plugin does one wrong thing
    "engine_object": "from toolrl import hookimpl\n@hookimpl\ndef register_rollout_engines(register):\n"
                     "    register(object, name='not-an-engine')\n",
    "exits": "import sys\nsys.exit()\n",
    "exits_in_hook": "import sys\nfrom toolrl import hookimpl\n@hookimpl\ndef register_tools(register):\n"
                     "    sys.exit(3)\n",
    "bad_schema": """
from toolrl import hookimpl
from toolrl.tools import Tool

class Broken(Tool):
    schema = {"type": "function", "function": {"name": "broken", "description": "x",
              "parameters": {"type": "object", "properties": {"n": {"type": "integr"}}}}}

    async def execute(self, instance_id, arguments, **kw):
        return "never", 0.0, {}

@hookimpl
def register_tools(register):
    register("bad_schema:Broken", name="broken")   # lazy, but into this (already imported) module
""",
    "lazy_object": "from toolrl import hookimpl\n@hookimpl\ndef register_tool_parsers(register):\n"
                   "    register('builtins:object', name='objparser')\n",
    "bad_reward": "from toolrl import hookimpl\n@hookimpl\ndef register_reward_functions(register):\n"
                  "    register(42, name='answer')\n",
    "logger_object": "from toolrl import hookimpl\n@hookimpl\ndef register_loggers(register):\n"
                     "    register(dict, name='not-a-logger')\n",
}


@pytest.fixture
def bad_dists(tmp_path):
    for name, code in BAD_PARTS.items():
        make_dist(tmp_path, f"toolrl-plugin-{name.replace('_', '-')}", name, name, code)
    return tmp_path


def test_wrong_parts_and_exits_are_listed_with_errors_and_the_rest_works(bad_dists):
    lenient = {"TOOLRL_STRICT_PLUGINS": ""}
    out = run_toolrl("list-plugins", "--json", path=bad_dists, env=lenient)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    errors = {name: rows[name]["error"] or "" for name in BAD_PARTS}
    assert all(rows[name]["status"] == "error" for name in BAD_PARTS), errors
    assert "not a toolrl.engines.RolloutEngine subclass" in errors["engine_object"]
    assert "SystemExit(None)" in errors["exits"] and "SystemExit(3)" in errors["exits_in_hook"]
    assert "invalid schema" in errors["bad_schema"] and "properties/n/type" in errors["bad_schema"]
    assert "not a toolrl.parsers.ToolParser subclass" in errors["lazy_object"]
    assert "not a reward function class" in errors["bad_reward"]
    assert "not a toolrl.loggers.Logger subclass" in errors["logger_object"]
    assert rows["calculator"]["status"] == "ok"
    text = run_toolrl("list-plugins", path=bad_dists, env=lenient)
    assert text.returncode == 0 and "error: rollout engine 'not-an-engine' (plugin 'engine_object')" in text.stdout
    called = run_toolrl("tool", "call", "calculator", '{"expression": "1+1"}', path=bad_dists, env=lenient)
    assert called.returncode == 0 and called.stdout.strip() == "2", called.stderr
    # A rejected part is not registered: using it is a one-line error, not a traceback.
    broken = run_toolrl("tool", "call", "broken", '{"n": 1}', path=bad_dists, env=lenient)
    assert broken.returncode == 2 and "unknown tool 'broken'" in broken.stderr and "Traceback" not in broken.stderr


LAZY_ELSEWHERE = """
from toolrl import hookimpl

@hookimpl
def register_tools(register):
    register("far_tool:Broken", name="far")
"""


def test_lazy_parts_are_checked_when_loaded_and_by_list_plugins_check(tmp_path):
    make_dist(tmp_path, "toolrl-plugin-far", "far", "far_plugin", LAZY_ELSEWHERE)
    (tmp_path / "far_tool.py").write_text(BAD_PARTS["bad_schema"].split("@hookimpl")[0])
    lenient = {"TOOLRL_STRICT_PLUGINS": ""}
    quick = {r["name"]: r for r in json.loads(run_toolrl("list-plugins", "--json", path=tmp_path,
                                                           env=lenient).stdout)}
    assert quick["far"]["status"] == "ok"  # listing imports no part's module
    # Checking loads every part: of the outside plugins only this one (where every plugin is installed,
    # plugins_vs_core, this test took 22.7 s more than with none; test_build_contract loads each part there).
    alone = {**lenient, "TOOLRL_LOAD_PLUGINS": "toolrl-plugin-far"}
    checked = run_toolrl("list-plugins", "--json", "--check", path=tmp_path, env=alone)
    far = {r["name"]: r for r in json.loads(checked.stdout)}["far"]
    assert far["status"] == "error" and "tool 'far' (plugin 'far') has an invalid schema" in far["error"]
    called = run_toolrl("tool", "call", "far", '{"n": 1}', path=tmp_path, env=alone)
    assert called.returncode == 2 and "invalid schema" in called.stderr and "Traceback" not in called.stderr


def test_registered_objects_are_checked_in_process(tmp_path, monkeypatch):
    make_dist(tmp_path, "toolrl-plugin-engine-object", "engine_object", "engine_object", BAD_PARTS["engine_object"])
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = Plugins(env={})
    assert by_name(plugins)["engine_object"].status == "error"
    assert not plugins.registry.has("rollout_engines", "not-an-engine")
    with pytest.raises(PluginLoadError, match="not a toolrl.engines.RolloutEngine subclass"):
        Plugins(env={"TOOLRL_STRICT_PLUGINS": "1"})


def test_a_part_that_fails_when_loaded_marks_its_plugin(tmp_path, monkeypatch):
    from toolrl.plugins.registry import PartError

    make_dist(tmp_path, "toolrl-plugin-far", "far", "far_plugin", LAZY_ELSEWHERE)
    (tmp_path / "far_tool.py").write_text("import sys\nsys.exit(4)\n")  # even this is contained
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = Plugins(env={})
    assert by_name(plugins)["far"].status == "ok"
    for _ in range(2):
        with pytest.raises(PartError, match=r"tool 'far' \(plugin 'far'\): 'far_tool:Broken' does not import: "
                                            r"SystemExit\(4\)"):
            plugins.registry.load("tools", "far")
    far = by_name(plugins)["far"]
    assert far.status == "error" and far.error.count("SystemExit(4)") == 1
