"""A whole Ray node lost mid-run: its trainer rank and everything in its object store go, and the run
goes on by itself from the copies the other node's rank pulled after the last step.

Two Ray nodes on this machine, started as a cluster is (``ray start --head``, then ``ray start
--address=...``), each with its own raylet and object store; rank 0 on the head, rank 1 on the
second node (``ray.trainer_rank_resources``). The second node's processes (its raylet, its workers,
its agents, its log monitor) are killed -9 after step 1.

Marked ``long`` (several minutes on 2 cores): run with ``nox -s long`` or
``pytest -m long tests/test_node_loss.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_sharded_training import (
    RECOVERY_BOUND_S,
    _computed,
    assert_trained_like_one_rank,
    config,
    even_tokens_plugin,
    lines,
    train,
    weights,
)
from toolrl.ray_cluster import init_ray

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")  # a dependency of Ray's
pytestmark = [pytest.mark.slow, pytest.mark.long]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_command() -> list[str]:
    """Ray's command line script of this Python (never a shim found on PATH)."""
    script = Path(sys.executable).with_name("ray")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ray.scripts.scripts"]


@dataclass
class Cluster:
    address: str
    temp_dir: str
    node2_pids: set[int] = field(default_factory=set)  # what `ray start` of the second node started
    node2_id: str = ""

    def processes(self) -> dict[int, Any]:
        """Every process of this cluster: those naming its temp dir, and what they started."""
        found = {}
        for p in psutil.process_iter(["cmdline"]):
            if self.temp_dir in " ".join(p.info["cmdline"] or []):
                found[p.pid] = p
        for p in list(found.values()):
            with suppress(psutil.NoSuchProcess):
                found.update({c.pid: c for c in p.children(recursive=True)})
        return found

    def kill_node2(self) -> list[int]:
        """SIGKILL the second node's processes: its raylet and all it started (the trainer rank's
        worker among them), and its log monitor. The head and its processes are left running."""
        victims = {pid: p for pid, p in self.processes().items() if pid in self.node2_pids}
        for p in list(victims.values()):
            with suppress(psutil.NoSuchProcess):
                victims.update({c.pid: c for c in p.children(recursive=True)})
        for p in victims.values():
            with suppress(psutil.NoSuchProcess):
                p.kill()
        return sorted(victims)

    def kill_all(self) -> None:
        for p in self.processes().values():
            with suppress(psutil.NoSuchProcess):
                p.kill()


def ray_start(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run([*ray_command(), "start", *args], env=env, capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        pytest.fail(f"ray start {' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}")


@contextmanager
def two_nodes(pythonpath: str, head: Sequence[str] = ("--num-cpus=3", '--resources={"head": 1}'),
              node2: Sequence[str] = ("--num-cpus=0", '--resources={"node2": 1}'),
              object_store: int = 1_000_000_000) -> Iterator[Cluster]:
    """A head and a second node on loopback (by default: 3 CPUs and resource ``head``; no CPUs and
    resource ``node2``, so only a rank asking for it goes there, never a rollout worker), each with its
    own ports and object store, in a temp dir of their own; every process of both killed at the end."""
    temp_dir = tempfile.mkdtemp(prefix="tlr-ray-", dir="/tmp")  # short: Ray's socket paths must fit
    port = free_port()
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}
    common = ["--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}", "--disable-usage-stats",
              f"--object-store-memory={object_store}"]
    cluster = Cluster(f"127.0.0.1:{port}", temp_dir)
    try:
        ray_start(["--head", f"--port={port}", *head, "--include-dashboard=false", f"--dashboard-port={free_port()}",
                   *common], env)
        started = set(cluster.processes())
        ray_start([f"--address={cluster.address}", *node2, *common], env)
        cluster.node2_pids = set(cluster.processes()) - started
        yield cluster
    finally:
        ray.shutdown()
        cluster.kill_all()
        shutil.rmtree(temp_dir, ignore_errors=True)


def kill_node_after(cluster: Cluster, run: Path, step: int, found: dict[str, Any], timeout: float = 900) -> None:
    """Kill the second node once checkpoint ``step`` is published (the next step is starting)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run / "checkpoints" / f"step_{step:06d}" / "meta.json").exists():
            found["rank_pid"] = json.loads((run / "placement.json").read_text())["trainer"][1]["pid"]
            found["killed"] = cluster.kill_node2()
            found["at"] = time.time()
            return
        time.sleep(0.05)


@contextmanager
def on_two_nodes(tmp_path: Path) -> Iterator[tuple[Cluster, str, tuple[str, ...]]]:
    """The two nodes, this process connected; the cluster, the head's node id, and the overrides
    that run on it with rank 0 on the head and rank 1 on the second node."""
    (tmp_path / "plugin").mkdir()
    plugin = even_tokens_plugin(tmp_path / "plugin")
    pythonpath = os.pathsep.join([str(Path(__file__).resolve().parents[1] / "core"), plugin])
    try:
        with two_nodes(pythonpath) as cluster:
            init_ray(cluster.address, 0, runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}})
            cluster.node2_id = next(n["NodeID"] for n in ray.nodes() if "node2" in n["Resources"])
            head_id = next(n["NodeID"] for n in ray.nodes() if "head" in n["Resources"])
            assert any(p.name() == "raylet" for pid, p in cluster.processes().items() if pid in cluster.node2_pids)
            yield cluster, head_id, (f"ray.address={cluster.address}",
                                     "ray.trainer_rank_resources=[{CPU: 1, head: 1}, {node2: 1}]")
    finally:
        with suppress(ValueError):
            sys.path.remove(plugin)  # the plugin even_tokens_plugin put there


def lose_node2(cluster: Cluster, run: Path, extra: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train 3 steps on two ranks, the second node killed after step 1; what was killed, and the
    recovery's row (checked: one, naming the lost node, from memory, nothing lost, in the bound)."""
    found: dict[str, Any] = {}
    killer = threading.Thread(target=kill_node_after, args=(cluster, run, 1, found), daemon=True)
    killer.start()
    train(config(run, 2, extra=extra))
    killer.join(timeout=5)
    print("killed the second node's processes:", found)
    assert found["rank_pid"] in found["killed"]
    rows = lines(run / "metrics.jsonl")
    print("snapshot_s:", [round(r["snapshot_s"], 3) for r in rows])
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["recoveries"] for r in rows] == [0, 1, 0]
    assert all(r["steps_lost"] == 0 and "failed" not in r for r in rows)
    (recovery,) = lines(run / "recoveries.jsonl")
    print("recovery:", {k: recovery[k] for k in ("died", "during", "mode", "node", "source", "recovery_s")})
    assert (recovery["world_size_before"], recovery["source"], recovery["steps_lost"]) == (2, "memory (step 1)", 0)
    assert recovery["died"].startswith(f"trainer rank 1 (pid {found['rank_pid']} ") and recovery["during"] == "step 2"
    assert recovery["node"] == cluster.node2_id  # the lost node, by its Ray id
    assert recovery["recovery_s"] < RECOVERY_BOUND_S
    assert recovery["time"] - found["at"] < RECOVERY_BOUND_S  # seen soon after the node went
    assert not next(n["Alive"] for n in ray.nodes() if n["NodeID"] == cluster.node2_id)
    return found, recovery


@pytest.mark.timeout(1800)
def test_a_lost_node_loses_no_step_in_shrink_mode(tmp_path):
    """trainer.on_rank_failure=shrink: the node of rank 1 is lost after step 1. Its copy of step 1
    was in that node's object store, and also in the head's (rank 0 pulled it); the group goes on
    with rank 0 alone from both copies: every step once, no step lost, the lost node named, and
    the run equals one trained on one rank throughout to fp32 reduction-order noise."""
    with on_two_nodes(tmp_path) as (cluster, head_id, extra):
        run = tmp_path / "lost-node"
        _, recovery = lose_node2(cluster, run, (*extra, "trainer.on_rank_failure=shrink"))
        one = train(config(tmp_path / "one", 1, extra=extra[:1]))

    assert (recovery["mode"], recovery["world_size"]) == ("shrink", 1)
    placement = json.loads((run / "placement.json").read_text())
    assert [(r["rank"], r["node_id"]) for r in placement["trainer"]] == [(0, head_id)]  # the new group: on the head
    assert_trained_like_one_rank(run, one, tmp_path)


@pytest.mark.timeout(1800)
def test_a_lost_node_in_replace_mode_is_replaced_on_the_head_and_the_run_is_exact(tmp_path):
    """trainer.on_rank_failure=replace (the default): the node of rank 1 is lost after step 1; the
    re-formed group waits for Ray to declare the node lost, then starts two ranks on the head (rank 1's
    pinning resource is gone with its node) from the two copies of step 1 (rank 1's from the head's
    object store). Every step's figures and the final weights equal an uninterrupted run's on the
    two nodes bit for bit."""
    with on_two_nodes(tmp_path) as (cluster, head_id, extra):
        whole = train(config(tmp_path / "whole", 2, extra=extra))
        run = tmp_path / "lost-node"
        _, recovery = lose_node2(cluster, run, extra)

    assert (recovery["mode"], recovery["world_size"]) == ("replace", 2)
    placement = json.loads((run / "placement.json").read_text())
    assert [(r["rank"], r["node_id"]) for r in placement["trainer"]] == [(0, head_id), (1, head_id)]
    for got, expected in zip(lines(run / "metrics.jsonl"), lines(whole / "metrics.jsonl"), strict=True):
        assert _computed(got) == _computed(expected), got["step"]
    w_want, w_got = weights(whole, 3, tmp_path), weights(run, 3, tmp_path)
    assert max(float((w_want[k] - w_got[k]).abs().max()) for k in w_want) == 0.0
