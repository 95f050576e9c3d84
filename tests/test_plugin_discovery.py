"""Plugin discovery that no plugin can kill or hang: external plugins are screened in a supervised child
first, and the verdict is cached until the installed plugins change (toolrl.plugins.screening)."""

import json
import os
from pathlib import Path

import pytest
from _dists import GOOD_PLUGIN, GOOD_TOOL_IMPL, make_dist, run_toolrl
from toolrl.plugins import Plugins

# Every plugin module notes its import in $PLUGIN_LOG, so a test sees where and how often it ran.
LOGGED = "import os\nwith open(os.environ['PLUGIN_LOG'], 'a') as _log:\n    _log.write({name!r} + '\\n')\n"
EXITS = LOGGED.format(name="exits") + "os._exit(1)\n"
# It also starts a helper process, which must not outlive the screening.
HANGS = LOGGED.format(name="hangs") + """
import subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(os.environ["PLUGIN_LOG"] + ".pid", "w") as _pid:
    _pid.write(str(helper.pid))
time.sleep(60)
"""
SEGFAULTS = "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"
EXITS_IN_HOOK = "import os\nfrom toolrl import hookimpl\n@hookimpl\ndef register_tools(register):\n    os._exit(3)\n"
CLOSES_FDS_AND_HANGS = "import os, time\nos.closerange(3, 4096)\ntime.sleep(60)\n"
CALLS_THE_LOADER = ("from toolrl import hookimpl\nfrom toolrl.plugins import get_plugins\n"
                    "PARSER = get_plugins().load_part('tool_parsers', 'hermes')\n"
                    "@hookimpl\ndef register_tools(register):\n    register('good_tool_impl:EchoTool', name='echo2')\n")
HANGS_IN_COMMANDS = ("import time\nfrom toolrl import hookimpl\n@hookimpl\ndef register_commands(cli):\n"
                     "    time.sleep(60)\n")


def add_good(root: Path) -> None:
    make_dist(root, "toolrl-plugin-good", "good", "good_plugin", LOGGED.format(name="good") + GOOD_PLUGIN)
    (root / "good_tool_impl.py").write_text(GOOD_TOOL_IMPL)


def imports(root: Path) -> list[str]:
    log = root / "imports.log"
    return log.read_text().split() if log.exists() else []


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")  # a zombie has ended; only its exit status waits to be collected


def env_for(root: Path, **extra: str) -> dict[str, str]:
    return {"TOOLRL_STRICT_PLUGINS": "", "TOOLRL_CACHE": str(root / "cache"), "PLUGIN_LOG": str(root / "imports.log"),
            **extra}


def listing(root: Path, **extra: str) -> dict[str, dict]:
    out = run_toolrl("list-plugins", "--json", path=root, env=env_for(root, **extra), timeout=60)
    assert out.returncode == 0, out.stderr
    return {r["name"]: r for r in json.loads(out.stdout)}


def test_a_plugin_calling_os_exit_at_import_is_listed_and_the_rest_work(tmp_path):
    add_good(tmp_path)
    make_dist(tmp_path, "toolrl-plugin-exits", "exits", "exits_plugin", EXITS)
    rows = listing(tmp_path)
    assert rows["exits"]["status"] == "error"
    assert rows["exits"]["error"] == "exited with status 1 during import; not loaded"
    assert rows["good"]["status"] == "ok" and rows["calculator"]["status"] == "ok"
    # Screened in a child (both), then the good one loaded here; the exiting one never ran here.
    assert sorted(imports(tmp_path)) == ["exits", "good", "good"]
    called = run_toolrl("tool", "call", "echo", '{"text": "hi"}', path=tmp_path, env=env_for(tmp_path))
    assert called.returncode == 0 and called.stdout.strip() == "hi", called.stderr
    assert sorted(imports(tmp_path)) == ["exits", "good", "good", "good"]  # the cached verdict: no child


def test_a_plugin_that_hangs_at_import_is_listed_after_the_time_limit(tmp_path):
    add_good(tmp_path)
    make_dist(tmp_path, "toolrl-plugin-hangs", "hangs", "hangs_plugin", HANGS)
    # Short limits: only the test's plugins load, so a busy machine cannot push a real one past them.
    only = "toolrl-plugin-good,toolrl-plugin-hangs"
    rows = listing(tmp_path, TOOLRL_PLUGIN_IMPORT_TIMEOUT_S="2", TOOLRL_LOAD_PLUGINS=only)
    assert rows["hangs"]["status"] == "error"
    assert rows["hangs"]["error"] == "import took longer than 2 s (TOOLRL_PLUGIN_IMPORT_TIMEOUT_S); not loaded"
    assert rows["good"]["status"] == "ok"
    assert imports(tmp_path).count("hangs") == 1
    assert not running(int((tmp_path / "imports.log.pid").read_text()))  # killed with the child
    listing(tmp_path, TOOLRL_PLUGIN_IMPORT_TIMEOUT_S="2", TOOLRL_LOAD_PLUGINS=only)
    assert imports(tmp_path).count("hangs") == 1  # cached: not even the child waits for it again
    rows = listing(tmp_path, TOOLRL_PLUGIN_IMPORT_TIMEOUT_S="3", TOOLRL_LOAD_PLUGINS=only)  # a new limit: again
    assert imports(tmp_path).count("hangs") == 2 and "longer than 3 s" in rows["hangs"]["error"]


def test_signals_and_hooks_that_end_or_hang_the_process_are_named(tmp_path):
    add_good(tmp_path)
    make_dist(tmp_path, "toolrl-plugin-segfaults", "segfaults", "segfaults_plugin", SEGFAULTS)
    make_dist(tmp_path, "toolrl-plugin-hook-exits", "hook_exits", "hook_exits_plugin", EXITS_IN_HOOK)
    make_dist(tmp_path, "toolrl-plugin-slow-commands", "slow_commands", "slow_commands", HANGS_IN_COMMANDS)
    make_dist(tmp_path, "toolrl-plugin-closes-fds", "closes_fds", "closes_fds", CLOSES_FDS_AND_HANGS)
    only = ",".join(f"toolrl-plugin-{name}" for name in ("good", "segfaults", "hook-exits", "slow-commands",
                                                          "closes-fds"))
    rows = listing(tmp_path, TOOLRL_PLUGIN_IMPORT_TIMEOUT_S="2", TOOLRL_LOAD_PLUGINS=only)
    assert rows["closes_fds"]["error"] == "import took longer than 2 s (TOOLRL_PLUGIN_IMPORT_TIMEOUT_S); not loaded"
    assert rows["segfaults"]["error"] == "killed by SIGSEGV during import; not loaded"
    assert rows["hook_exits"]["error"] == "exited with status 3 during register_tools; not loaded"
    assert rows["slow_commands"]["error"] == ("register_commands took longer than 2 s "
                                              "(TOOLRL_PLUGIN_IMPORT_TIMEOUT_S); not loaded")
    assert rows["good"]["status"] == "ok" and rows["good"]["parts"] == {"tools": ["echo"]}


def test_a_plugin_that_uses_the_loader_at_import_is_screened_once(tmp_path):
    # Loading plugins inside the screening child must not screen again (a child per level, forever).
    add_good(tmp_path)
    make_dist(tmp_path, "toolrl-plugin-loader-user", "loader_user", "loader_user", CALLS_THE_LOADER)
    rows = listing(tmp_path)
    assert rows["loader_user"]["status"] == "ok" and rows["loader_user"]["parts"] == {"tools": ["echo2"]}
    assert rows["good"]["status"] == "ok"


def test_editing_a_plugin_screens_it_again(tmp_path):
    add_good(tmp_path)
    assert listing(tmp_path)["good"]["status"] == "ok"
    module = tmp_path / "good_plugin.py"
    original = module.read_text()
    module.write_text(original + "os._exit(5)\n")  # an editable install, edited: now it ends the process
    later = module.stat().st_mtime + 10
    os.utime(module, (later, later))
    rows = listing(tmp_path)
    assert rows["good"]["error"] == "exited with status 5 during import; not loaded"
    module.write_text(original)  # fixed again
    os.utime(module, (later + 10, later + 10))
    assert listing(tmp_path)["good"]["status"] == "ok"


def test_strict_mode_disabling_and_a_bad_time_limit(tmp_path):
    make_dist(tmp_path, "toolrl-plugin-exits", "exits", "exits_plugin", EXITS)
    strict = run_toolrl("list-plugins", path=tmp_path, env=env_for(tmp_path, TOOLRL_STRICT_PLUGINS="1"))
    assert strict.returncode == 2 and strict.stdout == ""
    assert strict.stderr == ("error: plugin 'exits' (toolrl-plugin-exits): exited with status 1 during import; "
                             "not loaded\n")
    (tmp_path / "imports.log").unlink()
    rows = listing(tmp_path, TOOLRL_DISABLE_PLUGINS="exits")
    assert rows["exits"]["status"] == "disabled" and imports(tmp_path) == []  # a disabled plugin never runs
    bad = run_toolrl("list-plugins", path=tmp_path, env=env_for(tmp_path, TOOLRL_PLUGIN_IMPORT_TIMEOUT_S="soon"))
    assert bad.returncode == 2 and bad.stderr == (
        "error: TOOLRL_PLUGIN_IMPORT_TIMEOUT_S must be a positive number of seconds, not 'soon'\n")


def test_an_unusable_cache_only_costs_time(tmp_path):
    add_good(tmp_path)
    make_dist(tmp_path, "toolrl-plugin-exits", "exits", "exits_plugin", EXITS)
    (tmp_path / "not-a-dir").write_text("")
    for _ in range(2):
        rows = listing(tmp_path, TOOLRL_CACHE=str(tmp_path / "not-a-dir"))
        assert rows["exits"]["status"] == "error" and rows["good"]["status"] == "ok"
    assert imports(tmp_path).count("exits") == 2  # screened each time: nothing could be cached
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "plugin-verdicts.json").write_text("{not json")
    assert listing(tmp_path)["exits"]["status"] == "error"
    assert json.loads((tmp_path / "cache" / "plugin-verdicts.json").read_text())["records"]


def test_in_process_loading_is_screened_too(tmp_path, monkeypatch):
    add_good(tmp_path)
    make_dist(tmp_path, "toolrl-plugin-exits", "exits", "exits_plugin", EXITS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PLUGIN_LOG", str(tmp_path / "imports.log"))
    plugins = Plugins(env={"TOOLRL_CACHE": str(tmp_path / "cache")})
    info = {i.name: i for i in plugins.list()}
    assert info["exits"].status == "error" and "exited with status 1" in info["exits"].error
    assert plugins.registry.get("tools", "echo").plugin == "good"


@pytest.mark.parametrize("limit", ["0", "-1", "inf", "nan"])
def test_the_time_limit_must_be_a_positive_number(limit):
    from toolrl.plugins import PluginLoadError

    with pytest.raises(PluginLoadError, match="TOOLRL_PLUGIN_IMPORT_TIMEOUT_S must be a positive number"):
        Plugins(env={"TOOLRL_PLUGIN_IMPORT_TIMEOUT_S": limit})
