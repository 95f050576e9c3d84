"""A plugin may not change the process it is loaded into: the screening child takes the process's state
before and after each piece of a plugin's code (toolrl.plugins.process_state), and a plugin that
changes it — or raises KeyboardInterrupt — is listed with the change named and never loaded here, while
every command goes on as if it were not installed."""

import json
import os

from _dists import GOOD_PLUGIN, GOOD_TOOL_IMPL, make_dist, run_toolrl

HOSTILE = {
    "interrupts": ("raise KeyboardInterrupt\n", "raised KeyboardInterrupt during import"),
    "closes_stdout": ("import sys\nsys.stdout.close()\n", "replaced or closed the standard streams"),
    "swaps_stdout": ("import io, sys\nsys.stdout = io.StringIO()\n", "replaced or closed the standard streams"),
    "chdirs": ("import os\nos.chdir('/')\n", "changed the working directory to /"),
    "clears_path": ("import sys\nsys.path.clear()\n", "changed sys.path"),
    "recursion": ("import sys\nsys.setrecursionlimit(60)\n", "set the recursion limit to 60"),
    "signals": ("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n", "changed signal handlers"),
    "atexit": ("import atexit, os\natexit.register(os._exit, 7)\n", "registered exit handlers"),
    "thread": ("import threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()\n",
               "left 1 non-daemon thread(s) running"),
    "forks": ("import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n",
              "left 1 child process(es) running"),
    "prints": ("print('x' * 10_000_000)\n", "printed 10,000,001 bytes to stdout"),
    "patches": ("import toolrl.plugins.registry as r\nr.Registry.load = lambda self, kind, name: None\n",
                "replaced toolrl's own toolrl.plugins.registry.Registry.load"),
}


def test_plugins_that_change_the_process_are_listed_with_the_change_and_never_loaded(tmp_path):
    make_dist(tmp_path, "toolrl-plugin-good", "good", "good_plugin", GOOD_PLUGIN)
    (tmp_path / "good_tool_impl.py").write_text(GOOD_TOOL_IMPL)
    for name, (code, _) in HOSTILE.items():
        make_dist(tmp_path, f"toolrl-plugin-{name}", name, f"{name}_plugin", code)
    env = {"TOOLRL_STRICT_PLUGINS": "", "TOOLRL_CACHE": str(tmp_path / "cache")}
    out = run_toolrl("list-plugins", "--json", path=tmp_path, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}  # nothing printed into the command's output
    for name, (_, why) in HOSTILE.items():
        assert rows[name]["status"] == "error" and why in rows[name]["error"], (name, rows[name]["error"])
        assert rows[name]["error"].endswith("; not loaded")
    assert rows["good"]["status"] == "ok"
    # The next command reads the cached verdicts: the tool runs, in the directory it was started in,
    # and exits as it should (no handler of a plugin's turns the exit status into 7).
    called = run_toolrl("tool", "call", "echo", '{"text": "hi"}', path=tmp_path, env=env, timeout=120)
    assert called.returncode == 0 and called.stdout.strip() == "hi", called.stderr
    assert os.getcwd() != "/"


def test_a_malformed_entry_points_file_is_listed_with_its_error_and_breaks_nothing(tmp_path):
    make_dist(tmp_path, "toolrl-plugin-good", "good", "good_plugin", GOOD_PLUGIN)
    (tmp_path / "good_tool_impl.py").write_text(GOOD_TOOL_IMPL)
    for dist, text in (("toolrl-plugin-noeq", "[toolrl]\nnoeq noeq_plugin\n"),
                       ("toolrl-plugin-header", "[toolrl\nheader = header_plugin\n")):
        info = tmp_path / f"{dist.replace('-', '_')}-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
        (info / "entry_points.txt").write_text(text)
    env = {"TOOLRL_STRICT_PLUGINS": "", "TOOLRL_CACHE": str(tmp_path / "cache")}
    out = run_toolrl("list-plugins", "--json", path=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows["toolrl-plugin-noeq"]["status"] == "error"
    assert "entry_points.txt cannot be read" in rows["toolrl-plugin-noeq"]["error"]
    assert "malformed line" in rows["toolrl-plugin-header"]["error"]
    assert rows["good"]["status"] == "ok"


def test_a_hook_returning_junk_is_listed_with_a_readable_error(tmp_path):
    junk = ("from toolrl import hookimpl\n@hookimpl\ndef register_tools(register):\n"
            "    register(['x'] * 20000, name='junk')\n")
    make_dist(tmp_path, "toolrl-plugin-junk", "junk", "junk_plugin", junk)
    env = {"TOOLRL_STRICT_PLUGINS": "", "TOOLRL_CACHE": str(tmp_path / "cache")}
    out = run_toolrl("list-plugins", "--json", path=tmp_path, env=env)
    row = next(r for r in json.loads(out.stdout) if r["name"] == "junk")
    assert row["status"] == "error" and "more characters" in row["error"] and len(row["error"]) < 700
