"""Chaos on Ray on loopback: an asynchronous run (two trainer ranks on gloo, two rollout workers,
``max_staleness: 1``, ten steps, under ``--supervise``) whose trainer ranks, rollout workers and
controller are killed with SIGKILL on a seeded schedule, twice each in one run (one of the worker kills
while that worker is loading a weight push), over the object store and over ``broadcast`` (gloo links
from each rank to every worker), with the trainer group re-formed at its size (``replace``) or
one rank smaller (``shrink``; a restarted controller starts the configured two again). The run must
finish by itself, with every step once, nothing lost, each recovery recorded and each under a bound.

``replace`` runs the ``one_step_off`` schedule (each step's batch generated whole, on the weights before
the last step, while that step trains): nothing in it depends on timing, so every step's figures and the
final weights must equal an uninterrupted run's, bit for bit. ``shrink`` runs the ``stream`` schedule
(groups start as the staleness bound allows; the weights change under them), whose figures depend on
timing even without a kill: they are checked for being whole (finite, a gradient in every step whose
groups' rewards differ)."""

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _dists import EVEN_TOKENS, make_dist
from _processes import metrics
from test_sharded_training import _computed, weights
from test_trainer import TINY

STEPS = 10
SEED = int(os.environ.get("TOOLRL_CHAOS_SEED", "20261124"))  # another schedule: TOOLRL_CHAOS_SEED=N
RECOVERY_BOUND_S = 120.0  # each recovery, on two shared cores

# The workers' engine: the transformers engine, except that the first weight load after the test
# arms it (creates $TOOLRL_CHAOS_DIR/arm) takes the arm (an atomic rename, so one worker of the two),
# says its pid and waits there for the test's SIGKILL: a worker killed in the middle of a push (between
# two pieces of the stream, its senders mid-transfer, over any transport).
PAUSING_ENGINE = """
import os
import time
from pathlib import Path

from toolrl.engines.transformers import TransformersEngine


class PausingEngine(TransformersEngine):
    name = "pausing"

    def pause(self):
        chaos = Path(os.environ["TOOLRL_CHAOS_DIR"])
        try:
            os.rename(chaos / "arm", chaos / f"pushing-{os.getpid()}")
        except FileNotFoundError:
            return
        time.sleep(600)

    def load_weight_rows(self, name, shape, start, rows):  # in the middle of the stream
        self.pause()
        return super().load_weight_rows(name, shape, start, rows)
"""
PAUSING_PLUGIN = """
from toolrl import hookimpl


@hookimpl
def register_rollout_engines(register):
    register("pausing_engine:PausingEngine", name="pausing")
"""


def schedule(seed: int) -> list[tuple[int, str, int]]:
    """(after checkpoint k, what to kill, which one): each role twice, in a seeded order, spread over
    the run and ending two steps before its end (a dead worker is noticed when next used); "push" is a
    rollout worker killed inside the next weight load, never last. A kill waits for a checkpoint the previous
    recovery has already written placement.json before."""
    rng = random.Random(seed)
    kinds = ["trainer", "rollout_workers", "controller", "trainer", "push", "controller"]
    rng.shuffle(kinds)
    if kinds[-1] == "push":  # a later step's groups bring its replacement up (and into recoveries.jsonl)
        kinds[-2], kinds[-1] = kinds[-1], kinds[-2]
    return [(1 + i * (STEPS - 3) // (len(kinds) - 1), kind, rng.randrange(2)) for i, kind in enumerate(kinds)]


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("transport", ["object_store", "broadcast"])
@pytest.mark.parametrize("mode", ["replace", "shrink"])
def test_a_run_killed_in_every_role_several_times_finishes_with_every_step_once(tmp_path, mode, transport):
    (tmp_path / "plugin").mkdir()
    make_dist(tmp_path / "plugin", "even-tokens", "even", "even_tokens_plugin", EVEN_TOKENS)
    make_dist(tmp_path / "plugin", "pausing-engine", "pausing", "pausing_plugin", PAUSING_PLUGIN)
    (tmp_path / "plugin" / "pausing_engine.py").write_text(PAUSING_ENGINE)
    chaos = tmp_path / "chaos"
    chaos.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled", "TOOLRL_CHAOS_DIR": str(chaos),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "plugin"), os.environ.get("PYTHONPATH")]))}
    async_schedule = "one_step_off" if mode == "replace" else "stream"

    def args(out: Path) -> list[str]:
        return [sys.executable, "-m", "toolrl", "train", TINY, "ray.address=local",
                "trainer.world_size=2", f"trainer.on_rank_failure={mode}", "ray.num_rollout_workers=2",
                "trainer.max_staleness=1", f"trainer.async_schedule={async_schedule}", "engine.name=pausing",
                f"trainer.weight_transport={transport}",
                f"trainer.total_steps={STEPS}", f"trainer.output_dir={out}", "trainer.plot=false",
                "trainer.progress=false", "env_options.train_size=16", "rollout.n=2", "rollout.max_new_tokens=8",
                "rollout.max_response_tokens=16", "reward.functions=[{name: even_tokens}]"]

    if mode == "replace":  # the uninterrupted run to equal
        whole = subprocess.run(args(tmp_path / "whole"), env=env, capture_output=True, text=True, timeout=900)
        assert whole.returncode == 0, whole.stderr[-3000:]
    out = tmp_path / "run"
    plan = schedule(SEED)
    killed: list[tuple[int, str, int, int]] = []  # (after, kind, pid, the group's size then)
    supervisor = subprocess.Popen([*args(out), "--supervise"], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 1500

    def wait_until(done, what: str):
        while not (found := done()):
            assert supervisor.poll() is None, supervisor.stderr.read()[-3000:] if supervisor.stderr else ""
            assert time.monotonic() < deadline, f"{what}: not in time"
            time.sleep(0.05)
        return found

    try:
        for after, kind, index in plan:
            wait_until((out / "checkpoints" / f"step_{after:06d}" / "meta.json").exists, f"checkpoint {after}")
            placement = json.loads((out / "placement.json").read_text())
            if kind == "controller":
                (pid,) = children(supervisor.pid)
            elif kind == "push":
                (chaos / "arm").touch()
                (held,) = wait_until(lambda: list(chaos.glob("pushing-*")), f"a weight push after {after}")
                pid = int(held.name.removeprefix("pushing-"))
                held.unlink()
            elif kind == "rollout_workers":  # one that is up (placement.json names a replacement once it is)
                def live_workers():
                    workers = json.loads((out / "placement.json").read_text())["rollout_workers"]
                    return all(Path(f"/proc/{w['pid']}").exists() for w in workers) and workers
                pid = wait_until(live_workers, f"live workers after {after}")[index]["pid"]
            else:
                pid = placement[kind][index % len(placement[kind])]["pid"]  # a shrunk group has one rank
            os.kill(pid, signal.SIGKILL)
            killed.append((after, kind, pid, len(placement["trainer"])))
        _, stderr = supervisor.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        supervisor.kill()
    print("\n".join(line for line in stderr.splitlines() if "died" in line or "re-formed" in line))
    assert supervisor.returncode == 0, stderr[-3000:]

    rows = metrics(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)) and not any("failed" in r for r in rows)
    for r in rows:  # whole figures: a gradient wherever a group's rewards differ; at most one update stale
        traces = [json.loads(x) for x in (out / "rollouts" / f"step_{r['step']:05d}.jsonl").read_text().splitlines()]
        groups = len({t["group"] for t in traces})
        assert math.isfinite(r["loss"]) and (r["grad_norm"] > 0) == (r["equal_reward_groups"] < groups), r
        versions = {t["policy_version"] if isinstance(t["policy_version"], int) else t["policy_version"][0]
                    for t in traces}
        assert versions <= {r["step"] - 1, r["step"] - 2}, (r["step"], versions)  # also across restarts
    recoveries = [json.loads(x) for x in (out / "recoveries.jsonl").read_text().splitlines()]
    assert sum(r["steps_lost"] for r in recoveries) == 0 and sum(r["steps_lost"] for r in rows) == 0
    assert all(r["recovery_s"] < RECOVERY_BOUND_S for r in recoveries), recoveries
    # Each recovery counts in the next metrics row; a worker replaced after the last row only in the file.
    late = [r for r in recoveries if r["what"] == "rollout_worker" and r["step"] == STEPS]
    assert len(recoveries) - len(late) <= sum(r["recoveries"] for r in rows) <= len(recoveries)
    for after, kind, pid, size in killed:
        if kind == "trainer":  # replaced (or one rank fewer, never none), from the last step's copies
            (row,) = [r for r in recoveries if r["what"] == "trainer_rank" and f"pid {pid} " in r["died"]]
            expected = size if mode == "replace" else max(1, size - 1)
            assert (row["mode"], row["world_size_before"], row["world_size"]) == (mode, size, expected), row
            assert row["source"].startswith("memory"), row
        elif kind == "controller":  # restarted from the checkpoint it was killed after: nothing to train again
            (row,) = [r for r in recoveries if r["what"] == "controller" and f"pid {pid}," in r["died"]]
            assert (row["mode"], row["step"], row["steps_lost"]) == ("restart", after + 1, 0), row
        else:  # one log line names the dead worker; its replacement got the weights (the versions above)
            assert any(line.startswith("rollout worker") and f"(pid {pid} on " in line and "died" in line
                       for line in stderr.splitlines()), (pid, stderr[-3000:])
    # The worker killed inside a push: the push completed to the other, and its replacement came up with
    # the trainer's weights (a row, unless a controller killed later had not yet written it; the push kill
    # is never last, so later groups need the worker).
    ((push_at, push_pid),) = [(after, pid) for after, kind, pid, _ in killed if kind == "push"]
    pushed = [r for r in recoveries if r["what"] == "rollout_worker" and f"(pid {push_pid} on " in r["died"]]
    if pushed or not any(kind == "controller" and after > push_at for after, kind, _, _ in killed):
        (row,) = pushed
        # Over any transport the replacement gets them from its live peer worker when that holds them.
        assert row["during"].startswith("weight push") and row["source"].startswith(("trainer weights",
                                                                                       "peer worker")), row
    if mode == "replace":  # nothing depended on timing: the kills changed no figure and no weight
        assert [_computed(r) for r in rows] == [_computed(r) for r in metrics(tmp_path / "whole")]
        w_want, w_got = weights(tmp_path / "whole", STEPS, tmp_path), weights(out, STEPS, tmp_path)
        assert all(torch.equal(w_want[k], w_got[k]) for k in w_want)
