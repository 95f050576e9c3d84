"""A plugin that forks while it loads is screened out, and nothing it started outlives the command:
the screening child's copies (os.fork, or a fork at C level that Python's at-fork hooks never see,
even one that left the child's session) are found and killed; the plugin is listed as an error and
never loaded by the command itself."""

import json
import time
from pathlib import Path

import pytest
from _dists import GOOD_PLUGIN, GOOD_TOOL_IMPL, make_dist, run_toolrl

# Each plugin appends the pid of its copy to PIDS, in the process that made it.
FORKS = {
    # the daemon's double: the copy goes on, the process that loaded the plugin exits 0
    "daemon": "import os\npid = os.fork()\nif pid:\n    record(pid)\n    os._exit(0)\n",
    # the copy stays behind, asleep; the loading process goes on
    "sleeper": "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(60)\n    os._exit(0)\nrecord(pid)\n",
    # forked at C level (no at-fork hook runs in the copy), and the copy leaves the session
    "libc": ("import ctypes, os, time\npid = ctypes.CDLL(None).fork()\nif pid == 0:\n    os.setsid()\n"
             "    time.sleep(60)\n    os._exit(0)\nrecord(pid)\n"),
}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie is dead, only not yet reaped


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from Linux's /proc")
def test_a_plugin_that_forks_is_an_error_and_leaves_nothing_running(tmp_path):
    pids = tmp_path / "pids"
    make_dist(tmp_path, "toolrl-plugin-good", "good", "good_plugin", GOOD_PLUGIN)
    (tmp_path / "good_tool_impl.py").write_text(GOOD_TOOL_IMPL)
    for name, code in FORKS.items():
        record = f"def record(pid):\n    with open({str(pids)!r}, 'a') as f:\n        f.write(f'{{pid}}\\n')\n"
        make_dist(tmp_path, f"toolrl-plugin-{name}", name, f"{name}_plugin", record + code)
    env = {"TOOLRL_STRICT_PLUGINS": "", "TOOLRL_CACHE": str(tmp_path / "cache")}
    out = run_toolrl("list-plugins", "--json", path=tmp_path, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    # Whichever the supervisor hears first: the copy saying it was forked, the loading process seeing
    # its child still running, or the loading process gone.
    seen = ("forked the process", "left 1 child process(es) running", "exited with status 0")
    for name in FORKS:
        assert rows[name]["status"] == "error" and rows[name]["error"].endswith("; not loaded"), rows[name]
        assert rows[name]["error"].startswith(seen), rows[name]["error"]
    assert rows["libc"]["error"].startswith("left 1 child process(es) running")  # no at-fork hook ran in it
    assert rows["good"]["status"] == "ok"
    # Each copy's pid, as far as its maker wrote it before being killed (the libc copy's always is).
    made = [int(p) for p in pids.read_text().split()]
    assert made
    deadline = time.monotonic() + 10
    while any(alive(p) for p in made) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in made if alive(p)] == []
    # The next command reads the verdict: none of them runs again, and the tool works.
    called = run_toolrl("tool", "call", "echo", '{"text": "hi"}', path=tmp_path, env=env, timeout=120)
    assert called.returncode == 0 and called.stdout.strip() == "hi", called.stderr
    assert [int(p) for p in pids.read_text().split()] == made
