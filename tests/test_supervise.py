"""``toolrl train ... --supervise``: the controller killed with SIGKILL mid-run is started again by the
supervisor on the same run directory, continues from its last checkpoint, and the run finishes by
itself with every step once and the figures of the same run left alone; ``recoveries.jsonl`` and the
next step's metrics row record the restart."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from _dists import EVEN_TOKENS, make_dist, run_toolrl
from _processes import computed, metrics
from test_trainer import TINY

STEPS = 4


@pytest.mark.slow
@pytest.mark.long
def test_a_killed_controller_is_restarted_and_the_run_finishes_as_if_left_alone(tmp_path):
    (tmp_path / "plugin").mkdir()
    make_dist(tmp_path / "plugin", "even-tokens", "even", "even_tokens_plugin", EVEN_TOKENS)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "plugin"), os.environ.get("PYTHONPATH")]))}

    def args(out):
        return ["train", TINY, f"trainer.total_steps={STEPS}", f"trainer.output_dir={out}", "trainer.plot=false",
                "trainer.progress=false", "env_options.train_size=8", "rollout.n=2", "rollout.max_new_tokens=8",
                "rollout.max_response_tokens=16", "reward.functions=[{name: even_tokens}]"]

    straight = run_toolrl(*args(tmp_path / "straight"), env=env, timeout=600)
    assert straight.returncode == 0, straight.stderr[-2000:]
    out = tmp_path / "supervised"
    supervisor = subprocess.Popen([sys.executable, "-m", "toolrl", *args(out), "--supervise"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (out / "checkpoints" / "step_000002" / "meta.json").exists():
            assert supervisor.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        controller = json.loads((out / "placement.json").read_text())["trainer"][0]["pid"]  # the trainer runs in it
        assert controller != supervisor.pid
        os.kill(controller, signal.SIGKILL)
        _, stderr = supervisor.communicate(timeout=600)
    finally:
        supervisor.kill()
    assert supervisor.returncode == 0, stderr[-2000:]
    assert f"controller (pid {controller}) died (signal SIGKILL): restarting it from step_000002" in stderr
    rows = metrics(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)) and not any("failed" in r for r in rows)
    (restart,) = [json.loads(x) for x in (out / "recoveries.jsonl").read_text().splitlines()]
    assert (restart["what"], restart["mode"], restart["step"], restart["steps_lost"]) == ("controller", "restart", 3, 0)
    assert restart["died"] == f"controller (pid {controller}, signal SIGKILL)" and 0 < restart["recovery_s"] < 120
    assert [r["recoveries"] for r in rows] == [0, 0, 1, 0] and rows[2]["steps_lost"] == 0

    def same(rows):
        return [{k: v for k, v in r.items() if k != "recoveries"} for r in computed(rows)]

    assert same(rows) == same(metrics(tmp_path / "straight"))
