"""toolrl.processes.rollout_workers on real Ray: rollout workers match in-process rollouts, weights broadcast,
workers spread over two Ray nodes on this machine, a worker killed mid-step loses nothing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from toolrl.config import Config, load_config
from toolrl.tools import Tool

ray = pytest.importorskip("ray")
# Minutes of Ray start-up: run by the core session, left out of plugins_vs_core (-m "not slow").
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny.yaml")
SMALL = ["env_options.train_size=16", "data.batch_size=4", "rollout.n=2", "rollout.max_turns=2",
         "trainer.progress=false", "trainer.plot=false"]
LIMITER = "distributed-test"


def small_config(*overrides: str) -> Config:
    return load_config(TINY, [*SMALL, *overrides])


EXACT = ("trajectory_id", "group", "sample_index", "prompt_ids", "response_ids", "response_mask", "termination",
         "reward", "reward_terms")


def assert_same(got: list[Any], want: list[Any], tol: float = 1e-4) -> None:
    """Same trajectories: ids, tokens, masks, rewards exactly; engine logprobs up to float rounding
    (the rows batched together differ between processes, and with them the summation order)."""
    assert len(got) == len(want)
    for a, b in zip(got, want):
        for field in EXACT:
            assert getattr(a, field) == getattr(b, field), (b.trajectory_id, field)
        assert len(a.logprobs) == len(b.logprobs)
        assert all(abs(x - y) <= tol for x, y in zip(a.logprobs, b.logprobs)), (b.trajectory_id, "logprobs")


def prompts_for(run: Any, config: Config, step: int) -> list[Any]:
    from toolrl.processes.controller import batch_for_step

    return batch_for_step(run.samples, step, config.data.batch_size, config.trainer.seed, config.data.shuffle)


@pytest.fixture(scope="module", autouse=True)
def _ray_without_auth():
    """Every Ray in this module runs without token auth: the nodes started by ``ray start`` do, and
    one process cannot switch auth modes between Ray sessions (Ray 2.60 keeps the first)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        yield


def require_no_ray() -> None:
    if ray.is_initialized():
        pytest.fail("a Ray connection from an earlier test is still open")


# -- one machine, a local Ray ---------------------------------------------------------------------


@pytest.fixture(scope="class")
def local(tiny_qwen3_path):
    """The driver's composed run (model, engine, tools) and a pool of two workers on a local Ray."""
    from toolrl.processes.in_process import build_local_run
    from toolrl.processes.rollout_workers import RolloutWorkerPool

    require_no_ray()
    config = small_config("rollout.max_new_tokens=8", "rollout.max_response_tokens=16", "optim.lr=0.05")
    t0 = time.perf_counter()
    pool = RolloutWorkerPool(config, num_workers=2, address="local")
    try:
        init_s = time.perf_counter() - t0
        run = asyncio.run(build_local_run(config))
        t1 = time.perf_counter()
        infos = asyncio.run(pool.start())
        setups = ", ".join(f"{i['setup_s']:.1f}" for i in infos)
        print(f"\nray init {init_s:.1f} s; 2 workers up in {time.perf_counter() - t1:.1f} s (setup {setups} s)")
        yield config, run, pool, infos
    finally:
        asyncio.run(pool.close())
    assert not ray.is_initialized()  # the pool started Ray, so it shut it down


class TestLocalPool:
    def test_same_trajectories_as_in_process(self, local):
        config, run, pool, infos = local
        from toolrl.rollout import run_rollouts

        assert len({i["pid"] for i in infos}) == 2 and os.getpid() not in {i["pid"] for i in infos}
        prompts = prompts_for(run, config, 0)
        finished = [ray.get(w.ping.remote())["finished"] for w in pool.workers]
        t0 = time.perf_counter()
        want = asyncio.run(run_rollouts(run.ctx, prompts, config.rollout.n, seed=11, id_prefix="t1-"))
        t1 = time.perf_counter()
        got = asyncio.run(pool.run(prompts, config.rollout.n, seed=11, id_prefix="t1-"))
        print(f"\nstep rollouts: in-process {t1 - t0:.2f} s, 2 Ray workers {time.perf_counter() - t1:.2f} s")
        assert len(got) == len(prompts) * config.rollout.n == 8
        assert_same(got, want)
        assert [t.group for t in got] == [0, 0, 1, 1, 2, 2, 3, 3]
        # Both workers did half: groups are split, never a group across two workers.
        assert [ray.get(w.ping.remote())["finished"] - f for w, f in zip(pool.workers, finished)] == [4, 4]

    def test_broadcast_after_a_grpo_step(self, local):
        """The trainer's loop: roll out on the workers, update in the driver, broadcast; the next
        rollouts come from the updated weights."""
        import torch
        from toolrl.rollout import run_rollouts
        from toolrl.training.step import StepOptions, train_step

        config, run, pool, _ = local
        prompts = prompts_for(run, config, 1)
        before = asyncio.run(pool.run(prompts, config.rollout.n, seed=3, id_prefix="t2-"))
        optimizer = torch.optim.AdamW(run.model.parameters(), lr=config.optim.lr)
        stats = train_step(run.model, optimizer, before,
                          StepOptions(config.algorithm, config.optim, pad_id=run.tokenizer.pad_token_id,
                                      temperature=config.rollout.temperature,
                                      max_response_tokens=config.rollout.max_response_tokens))
        assert stats["trained_tokens"] > 0
        run.model.eval()
        t0 = time.perf_counter()
        asyncio.run(pool.broadcast(run.model.state_dict()))
        print(f"\nbroadcast of {sum(v.numel() for v in run.model.state_dict().values()) / 1e6:.1f} M params "
              f"to 2 workers: {time.perf_counter() - t0:.2f} s")
        after = asyncio.run(pool.run(prompts, config.rollout.n, seed=3, id_prefix="t2-"))
        want = asyncio.run(run_rollouts(run.ctx, prompts, config.rollout.n, seed=3, id_prefix="t2-"))
        assert_same(after, want)
        moved = max(abs(x - y) for a, b in zip(after, before) for x, y in zip(a.logprobs, b.logprobs))
        assert moved > 1e-2  # the workers sample from the new weights, not the old ones


# -- two Ray nodes on this machine ----------------------------------------------------------------


class GateTool(Tool):
    """Passes every trajectory's ``release`` through the cluster-wide limiter ``LIMITER``: the
    limiter's count then says whether all workers, on both nodes, share one limiter actor. (At
    release, after the last generation, its latency cannot change how the engine batches rows.)"""

    schema = {"type": "function", "function": {
        "name": "gate", "description": "Does nothing.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}

    async def release(self, instance_id: str, **release_kwargs: Any) -> None:
        from toolrl.tools.ratelimit import make_rate_limiter

        async with make_rate_limiter(max_in_flight=1, global_name=LIMITER).slot():
            await super().release(instance_id, **release_kwargs)

    async def execute(self, instance_id: str, arguments: dict[str, Any], **execute_kwargs: Any):
        return "ok", 0.0, {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session_processes(sid: int) -> list[int]:
    """Processes in session ``sid``: everything a ``ray start`` we ran in its own session spawned."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
                if int(fields[3]) == sid:
                    pids.append(int(entry.name))
    return pids


def stop_sessions(sids: list[int], grace_s: float = 3) -> None:
    """End our Ray nodes by process id (``ray stop`` would end every Ray on this machine)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for sid in sids:
            for pid in session_processes(sid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(session_processes(s) for s in sids):
            time.sleep(0.2)


def ray_start(args: list[str], env: dict[str, str], log: Path) -> int:
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", *args,
                                 "--disable-usage-stats"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        rc = proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        stop_sessions([proc.pid])
        raise
    if rc != 0:
        stop_sessions([proc.pid])
        raise RuntimeError(f"ray start failed ({rc}):\n{log.read_text()[-3000:]}")
    return proc.pid


@pytest.fixture(scope="class")
def two_nodes():
    """A head node and a second node (custom resource ``node2``). Four logical CPUs each: Ray's
    default scheduling then packs two workers onto one node, so only the pool's placement spreads them."""
    require_no_ray()
    temp = Path(tempfile.mkdtemp(prefix="toolrl-ray-", dir="/tmp"))  # short: Ray's socket paths
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           # Workers import GateTool from this file.
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))}
    sids: list[int] = []
    try:
        t0 = time.perf_counter()
        # Fixed default ports (dashboard, agents) could be taken by another Ray on this machine.
        common = ["--num-cpus=4", "--object-store-memory=300000000"]
        sids.append(ray_start(["--head", f"--port={port}", f"--temp-dir={temp}", "--include-dashboard=false",
                               f"--dashboard-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
                               *common], env, temp / "head.log"))
        sids.append(ray_start([f"--address=127.0.0.1:{port}", '--resources={"node2": 1}',
                               f"--dashboard-agent-listen-port={free_port()}", *common], env, temp / "node2.log"))
        print(f"\ntwo Ray nodes up in {time.perf_counter() - t0:.1f} s")
        yield f"127.0.0.1:{port}"
    finally:
        if ray.is_initialized():
            ray.shutdown()
        stop_sessions(sids)
        shutil.rmtree(temp, ignore_errors=True)
    assert not any(session_processes(s) for s in sids)


def kill_when_running(actor: Any, found: dict[str, Any], timeout: float = 120) -> None:
    """Kill ``actor`` as soon as it reports a run in progress (from a thread, while ``run`` waits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ray.get(actor.ping.remote())["running"] > 0:
            ray.kill(actor, no_restart=True)
            found["killed_at"] = time.monotonic()
            return
        time.sleep(0.02)


class TestTwoNodes:
    def test_workers_on_both_nodes_and_a_killed_worker_loses_nothing(self, two_nodes, tiny_qwen3_path):
        from toolrl.data.sources import load_samples
        from toolrl.processes.rollout_workers import RolloutWorkerPool
        from toolrl.tools.ratelimit import RayRateLimiter

        config = small_config("rollout.max_new_tokens=24", "rollout.max_response_tokens=48",
                              f"tools.entries=[{{class_name: {Path(__file__).stem}.GateTool}}]")
        prompts = load_samples(config)[: config.data.batch_size]
        ray.init(address=two_nodes)
        nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
        assert len(nodes) == 2
        node2 = next(n for n, res in nodes.items() if "node2" in res)
        # Created here first, the limiter lives as long as this driver, whichever worker dies; the
        # lease frees a slot the killed worker may hold.
        limiter = RayRateLimiter(LIMITER, max_in_flight=1, lease_timeout_s=2)

        pool = RolloutWorkerPool(config, num_workers=2, address=two_nodes)
        try:
            t0 = time.perf_counter()
            infos = asyncio.run(pool.start())
            print(f"\n2 workers on 2 nodes up in {time.perf_counter() - t0:.1f} s")
            # One worker per node, as each says from inside its own process.
            assert {i["node_id"] for i in infos} == set(nodes)
            assert {ray.get(w.ping.remote())["node_id"] for w in pool.workers} == set(nodes)

            t0 = time.perf_counter()
            want = asyncio.run(pool.run(prompts, config.rollout.n, seed=7, id_prefix="t1-"))
            healthy_s = time.perf_counter() - t0
            assert len(want) == 8

            victim = next(w for w, i in zip(pool.workers, infos) if i["node_id"] == node2)
            found: dict[str, Any] = {}
            killer = threading.Thread(target=kill_when_running, args=(victim, found), daemon=True)
            t0 = time.monotonic()
            killer.start()
            got = asyncio.run(pool.run(prompts, config.rollout.n, seed=7, id_prefix="t1-"))
            done = time.monotonic()
            killer.join(timeout=5)
            assert "killed_at" in found and t0 < found["killed_at"] < done  # killed mid-step
            print(f"step: {healthy_s:.1f} s healthy, {done - t0:.1f} s with a worker killed "
                  f"{found['killed_at'] - t0:.1f} s in")
            assert pool.slots.restarts == 1 and pool.rerun_groups == 2  # the victim's half, run again
            assert_same(got, want)  # same seeds, same trajectories: nothing lost or changed

            # The replacement comes up on the node of the worker it replaces.
            t0 = time.perf_counter()
            [_, replaced] = sorted(asyncio.run(pool.start()), key=lambda i: i["node_id"] == node2)
            print(f"replacement up {time.perf_counter() - t0:.1f} s after the step")
            assert replaced["node_id"] == node2 and replaced["pid"] not in {i["pid"] for i in infos}
            # Every trajectory's release, on both nodes, went through the one limiter made here; the
            # victim's admissions before it died count too.
            stats = limiter.stats()
            assert 16 <= stats["admitted"] <= 20 and stats["in_flight"] == 0
        finally:
            asyncio.run(pool.close())
        assert ray.is_initialized()  # the pool joined this connection, so it left it open
        ray.shutdown()

    def test_more_workers_than_the_cluster_fits_is_a_config_error(self, two_nodes, tiny_qwen3_path):
        """On the two nodes (4 CPUs each; no Ray of its own to start): 9 workers of 1 CPU do not fit."""
        from toolrl.config import ConfigError
        from toolrl.processes.rollout_workers import RolloutWorkerPool

        require_no_ray()
        ray.init(address=two_nodes)
        try:
            with pytest.raises(ConfigError, match=r"ray.num_rollout_workers=9 needs 9 CPUs .* the cluster has 8 CPUs"):
                RolloutWorkerPool(small_config(), num_workers=9, address=None)
            assert ray.is_initialized()  # not the pool's Ray: left open
        finally:
            ray.shutdown()


# -- the CLI ----------------------------------------------------------------------------------------


def test_a_local_ray_that_times_out_starting_is_started_once_more(monkeypatch, caplog):
    """Ray gives a starting node 30 s to register, which a loaded machine can miss. That timeout cannot be
    produced on demand, so ``ray.init`` is replaced here by one that raises Ray's own message first."""
    import ray
    from toolrl.ray_cluster import init_ray

    calls, shutdowns = [], []
    timed_out = Exception("The current node timed out during startup. This could happen because some of the "
                          "raylet failed to startup or the GCS has become overloaded.")

    def init(**options):
        calls.append(options)
        if len(calls) == 1:
            raise timed_out

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(1))
    with caplog.at_level("WARNING"):
        init_ray("local", 3, runtime_env={"env_vars": {"A": "1"}})
    assert len(calls) == 2 and shutdowns == [1] and calls[0] == calls[1]
    assert calls[1]["num_cpus"] == max(os.cpu_count() or 1, 3) and calls[1]["runtime_env"] == {"env_vars": {"A": "1"}}
    assert "Ray's local node timed out starting (a busy machine); starting it once more" in caplog.text
    calls.clear()
    with pytest.raises(Exception, match="timed out during startup"):  # a cluster toolrl did not start
        init_ray("auto", 3)
    assert len(calls) == 1


    def never(**options):
        calls.append(options)
        raise timed_out

    calls.clear()
    monkeypatch.setattr(ray, "init", never)
    with pytest.raises(Exception, match="timed out during startup"):  # once more, not forever
        init_ray("local", 1)
    assert len(calls) == 2
