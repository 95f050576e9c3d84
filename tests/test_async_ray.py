"""Streaming rollouts on Ray workers (real Ray on loopback, the tiny model): groups go to the
least-loaded live worker, a worker that dies mid-group is replaced and its group runs again, and new
weights pushed in buckets while a trajectory is in flight reach its next turn, never half of them.

The workers' model is set, through the weight pushes themselves, to a "chain" model that always
emits one gate tool call (its layers add nothing, so each token's embedding alone picks the next
token), greedily: every turn is the same text, and the scale of its logits, which each test's push
sets, shows in the logprobs which weights produced a turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from toolrl.config import load_config
from toolrl.schemas import Sample

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny.yaml")
CALL = '<tool_call>{"name":"gate","arguments":{}}</tool_call>'


def chain_weights(model: Any, tokenizer: Any, scale: float) -> dict[str, Any]:
    """``model``'s state with every layer's output zeroed and embeddings that make the greedy
    continuation of any text ``CALL`` then ``<|im_end|>``, with logit ``8 * scale`` for each token
    (the final norm scales each one-hot embedding of 50 to sqrt(hidden) = 8)."""
    ids = tokenizer.encode(CALL, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    emb, head = state["model.embed_tokens.weight"], state["lm_head.weight"]
    assert len(set(ids)) == len(ids) < emb.shape[1]  # one embedding direction per token of the chain
    for name, value in state.items():
        if name.startswith("model.layers.") and name.endswith("proj.weight"):
            value.zero_()
    emb.zero_()
    head.zero_()
    emb[:, 0] = 50.0  # any other token: start the call
    head[ids[0], 0] = scale
    for i, (tok, nxt) in enumerate(zip(ids, ids[1:]), start=1):
        emb[tok, 0], emb[tok, i], head[nxt, i] = 0.0, 50.0, scale
    state["model.norm.weight"].fill_(1.0)
    return state


def logprob_at(scale: float, vocab: int = 151936) -> float:
    """The greedy token's logprob when its logit is ``8 * scale`` and every other one is 0."""
    import math

    return -math.log1p((vocab - 1) * math.exp(-8 * scale))


def sample(gate: str, index: int = 0) -> Sample:
    return Sample(prompt=[{"role": "user", "content": "Open the gate."}], index=index,
                  tools_kwargs={"gate": {"execute_kwargs": {"gate": gate}}})


def turn_logprobs(traj: Any) -> list[list[float]]:
    """The engine logprobs of each turn's tokens."""
    turns: list[list[float]] = []
    previous = 0
    for lp, m in zip(traj.logprobs, traj.response_mask):
        if m and not previous:
            turns.append([])
        if m:
            turns[-1].append(lp)
        previous = m
    return turns


def wait_for(predicate: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := predicate():
            return found
        time.sleep(0.02)
    raise TimeoutError("condition not met")


def waiting_pid(gates: Path, gate: str, exclude: set[int] = frozenset()) -> int | None:
    """The pid of the worker whose trajectory waits at ``gate`` (None while none does)."""
    pids = {int(p.name.split(".")[1]) for p in gates.glob(f"{gate}.*.waiting")} - set(exclude)
    return next(iter(pids), None)


class Trainer:
    """The trainer side of a push, in the driver: a model whose weights go to the workers over the
    object_store transport, as a trainer rank sends them (``send_owned``), one link per worker so a
    worker that dies or hangs fails its own link only (the trainer group makes new links instead)."""

    def __init__(self, path: str, tokenizer: Any, bucket_mb: float) -> None:
        from toolrl import model_sources

        self.model = model_sources.load_model(path)
        self.tokenizer, self.bucket_mb = tokenizer, bucket_mb
        self.scale = 0.0  # of the chain weights the model holds
        self.timeout_s: float | None = None  # trainer.weight_push_timeout_s

    def set_scale(self, scale: float) -> None:
        self.model.load_state_dict(chain_weights(self.model, self.tokenizer, scale))
        self.scale = scale

    def link(self, receivers: int) -> Any:
        from toolrl.transports.object_store import ObjectStoreTransport

        transport = ObjectStoreTransport()
        return transport, transport.open_sender(f"test-{uuid.uuid4().hex[:8]}", 0, receivers, self.timeout_s or 120.0)

    async def push(self, targets: Any, version: int | None = None) -> Any:
        from toolrl.processes import WeightPush
        from toolrl.training.weight_sync import SyncStats, send_owned

        async def one(target: Any) -> Any:
            try:  # a worker dead (or stopped) already: no link waits out its timeout for it
                await asyncio.wait_for(target.ping.remote(), 5.0)
            except Exception:
                return None
            transport, sender = self.link(1)
            receive = target.receive_weights.remote(transport, [sender.link], 0, version)
            try:
                stats = await asyncio.to_thread(send_owned, self.model, sender, 0, 1, self.bucket_mb)
                await asyncio.wait_for(receive, sender.link.timeout_s)
                return stats
            except Exception:  # the worker died or hung: its link failed
                return None
            finally:
                sender.close()

        results = await asyncio.gather(*(one(t) for t in targets))
        stats = next((r for r in results if r is not None), SyncStats())
        return WeightPush(stats.as_metrics(), [t for t, r in zip(targets, results, strict=True) if r is None])


@pytest.fixture(scope="module")
def setting(tmp_path_factory, tiny_qwen3_path):
    """Two workers on a local Ray, all on the chain model at scale 3 (version 0)."""
    from toolrl import model_sources
    from toolrl.model_sources import model_path
    from toolrl.processes import sync_weights
    from toolrl.processes.rollout_workers import RolloutWorkerPool

    if ray.is_initialized():
        pytest.fail("a Ray connection from an earlier test is still open")
    gates = tmp_path_factory.mktemp("gates")
    config = load_config(TINY, [
        "model.tiny={tie_word_embeddings: false}", "rollout.temperature=0", "rollout.n=1", "rollout.max_turns=2",
        f"tools.entries=[{{class_name: async_ray_tools.GateTool, config: {{dir: '{gates}', timeout: 120}}}}]",
        "trainer.progress=false"])
    with pytest.MonkeyPatch.context() as mp:
        # The workers import the gate tool from tests/; one auth mode for every Ray in the session.
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])))
        mp.setenv("RAY_AUTH_MODE", "disabled")
        path = model_path(config)
        trainer = Trainer(path, model_sources.load_tokenizer(path), bucket_mb=1.0)
        trainer.set_scale(3.0)
        pool = RolloutWorkerPool(config, num_workers=2, address="local")
        pool.slots.weights_from = trainer
        try:
            asyncio.run(pool.start())
            asyncio.run(sync_weights(trainer, pool, 0))
            yield pool, trainer, gates
        finally:
            asyncio.run(pool.close())
    assert not ray.is_initialized()


def versions(pool: Any) -> list[int]:
    return [ray.get(w.ping.remote())["weight_version"] for w in pool.workers]


def both_workers_serve(pool: Any, gates: Path, version: int, scale: float, seed: int) -> None:
    """After a worker was replaced: both workers hold ``version`` and sample one group each from the
    weights pushed at ``scale``."""
    (gates / "open").touch()
    asyncio.run(pool.start())
    assert versions(pool) == [version, version]
    again = asyncio.run(pool.run([sample("open", 0), sample("open", 1)], 1, seed=seed, id_prefix=f"t{seed}-"))
    assert [t.policy_versions for t in again] == [[version, version]] * 2  # one group on each worker
    assert all(lp == pytest.approx(logprob_at(scale), abs=1e-3)
               for t in again for turn in turn_logprobs(t) for lp in turn)


def the_recovery(pool: Any, pid: int) -> dict[str, Any]:
    """The one row the pool recorded (for ``recoveries.jsonl``) since it was last asked: the worker
    ``pid``'s death, and where its replacement, up now, runs."""
    (row,) = pool.take_recoveries()
    assert (row["what"], row["mode"], row["steps_lost"]) == ("rollout_worker", "replace", 0), row
    assert f"(pid {pid} on " in row["died"] and row["worker"]["pid"] != pid and 0 < row["recovery_s"] < 120, row
    assert ray.get(pool.workers[row["index"]].ping.remote())["pid"] == row["worker"]["pid"], row
    return row


def test_weights_pushed_while_a_trajectory_waits_reach_its_next_turn(setting):
    from toolrl.processes import sync_weights

    pool, trainer, gates = setting

    async def scenario() -> tuple[Any, dict[str, Any]]:
        task = asyncio.ensure_future(pool.run_group(sample("push"), 0, 1, seed=5, id_prefix="t1-"))
        await asyncio.to_thread(wait_for, lambda: waiting_pid(gates, "push"))  # turn 1 done, on version 0
        trainer.set_scale(1.5)
        sync = await sync_weights(trainer, pool, 1)  # in flight: the trajectory is still running
        assert not task.done()
        (gates / "push").touch()
        return await task, sync

    [traj], sync = asyncio.run(scenario())
    assert sync["weight_sync_s"] > 0 and versions(pool) == [1, 1] and pool.slots.weight_version == 1
    assert traj.turns == 2 and traj.termination == "max_turns"
    assert traj.policy_versions == [0, 1]  # the weights changed mid-trajectory, and it says so
    assert [t.response.text for t in traj.tool_results] == ["open", "open"]
    first, second = turn_logprobs(traj)
    assert first == pytest.approx([logprob_at(3.0)] * len(first), abs=1e-4)  # the old weights
    assert second == pytest.approx([logprob_at(1.5)] * len(second), abs=1e-3)  # the new ones


def test_an_update_is_loaded_whole_between_two_decode_steps(setting):
    """A worker in the middle of an update (its first bucket in, the stream not ended) holds decoding:
    a group started then samples only from the whole update, and carries its version; the label does
    not move before the last bucket."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from toolrl.training.weight_sync import SyncStats, owned_buckets

    pool, trainer, gates = setting
    (gates / "open").touch()
    before = versions(pool)
    trainer.set_scale(1.0)
    transport, sender = trainer.link(len(pool.workers))
    receives = [w.receive_weights.remote(transport, [sender.link], i, before[0] + 1) for i, w in enumerate(pool.workers)]
    resume = threading.Event()

    def paused() -> Any:
        buckets = owned_buckets(trainer.model, 0, 1, 1 << 20, SyncStats())
        yield next(buckets)
        resume.wait(120)
        yield from buckets

    sending = threading.Thread(target=sender.send, args=(paused(),))
    sending.start()
    try:
        # Both workers took the first bucket: each is inside its update.
        wait_for(lambda: ray.get(sender.mailbox.__ray_call__.remote(lambda box: box.taken.get((0, 0), 0))) == 2)
        assert versions(pool) == before
        with ThreadPoolExecutor(1) as group:
            run = group.submit(asyncio.run, pool.run([sample("open")], 1, seed=1, id_prefix="b-"))
            time.sleep(2.0)  # the group is started, and waits for the update
            resume.set()
            [traj] = run.result(120)
        ray.get(receives)
    finally:
        resume.set()
        sending.join(120)
        sender.close()
    assert versions(pool) == [before[0] + 1] * 2 and traj.policy_versions == [before[0] + 1] * 2
    assert all(lp == pytest.approx(logprob_at(1.0), abs=1e-3) for turn in turn_logprobs(traj) for lp in turn)
    # A label alone (set_weight_version) moves no weights.
    asyncio.run(pool.set_weight_version(9))
    assert versions(pool) == [9, 9] and pool.slots.weight_version == 9
    asyncio.run(pool.set_weight_version(before[0] + 1))
    assert versions(pool) == [before[0] + 1] * 2


def test_groups_go_to_the_least_loaded_worker_and_survive_its_death(setting):
    pool, trainer, gates = setting
    pids = [ray.get(w.ping.remote())["pid"] for w in pool.workers]
    version = pool.slots.weight_version
    pool.take_recoveries()  # an earlier test's

    async def scenario() -> tuple[list[Any], list[Any], int]:
        first = asyncio.ensure_future(pool.run_group(sample("k1", 3), 3, 1, seed=9, id_prefix="t2-"))
        holder = await asyncio.to_thread(wait_for, lambda: waiting_pid(gates, "k1"))
        second = asyncio.ensure_future(pool.run_group(sample("k2", 4), 4, 1, seed=9, id_prefix="t2-"))
        other = await asyncio.to_thread(wait_for, lambda: waiting_pid(gates, "k2"))
        assert {holder, other} == set(pids)  # the idle worker took the second group
        ray.kill(pool.workers[pids.index(holder)], no_restart=True)
        # The first group runs again on the live worker, from the start.
        assert await asyncio.to_thread(wait_for, lambda: waiting_pid(gates, "k1", {holder})) == other
        (gates / "k1").touch()
        (gates / "k2").touch()
        return await first, await second, holder

    first, second, killed = asyncio.run(scenario())
    assert pool.slots.restarts == 1 and pool.rerun_groups == 1
    assert [t.trajectory_id for t in first + second] == ["t2-s3-g3-0", "t2-s4-g4-0"]
    assert all(t.turns == 2 and t.error is None for t in first + second)

    # The replacement came up in the killed worker's slot with the trainer's weights and version.
    (gates / "open").touch()
    infos = asyncio.run(pool.start())
    assert killed not in {i["pid"] for i in infos} and versions(pool) == [version, version]
    again = asyncio.run(pool.run([sample("open", 0), sample("open", 1)], 1, seed=9, id_prefix="t3-"))
    assert [t.turns for t in again] == [2, 2]  # one group on each worker
    assert [t.policy_versions for t in again] == [[version, version]] * 2
    assert all(lp == pytest.approx(logprob_at(trainer.scale), abs=1e-3)
               for t in again for turn in turn_logprobs(t) for lp in turn)
    assert the_recovery(pool, killed)["during"] == "group 3"


def test_a_worker_found_dead_by_a_weight_sync_is_replaced_and_gets_the_weights(setting):
    """The controller's weight sync: the trainer pushes to the live workers, the one found dead is
    replaced (``RolloutWorkerPool.replace``), and its replacement gets the pushed weights and their
    version before it runs anything."""
    from ray.exceptions import RayActorError
    from toolrl.processes import RolloutGroup, sync_weights

    pool, trainer, gates = setting
    assert isinstance(pool, RolloutGroup)
    victim = pool.workers[1]
    pid = ray.get(victim.ping.remote())["pid"]
    pool.take_recoveries()  # an earlier test's
    ray.kill(victim, no_restart=True)

    def gone() -> bool:
        try:
            ray.get(victim.ping.remote())
        except RayActorError:
            return True
        return False

    wait_for(gone)
    restarts, version = pool.slots.restarts, pool.slots.weight_version + 1
    trainer.set_scale(2.0)
    sync = asyncio.run(sync_weights(trainer, pool, version))
    assert sync["weight_sync_s"] > 0 and pool.slots.restarts == restarts + 1 and pool.workers[1] is not victim
    both_workers_serve(pool, gates, version, 2.0, seed=4)
    row = the_recovery(pool, pid)
    assert (row["during"], row["source"]) == (f"weight push {version}", f"trainer weights (version {version})"), row


def test_a_worker_that_hangs_during_a_weight_push_is_replaced_and_gets_the_weights(setting):
    """A worker that hangs (its process stopped, as behind a lost network link) during a weight push:
    after trainer.weight_push_timeout_s over a bucket it counts as dead, the push completes to the
    live worker, and the hung worker's replacement gets the pushed weights and version. No hang."""
    import signal

    from toolrl.processes import sync_weights

    pool, trainer, gates = setting
    hung = pool.workers[1]
    pid = ray.get(hung.ping.remote())["pid"]
    restarts, version = pool.slots.restarts, pool.slots.weight_version + 1
    pool.take_recoveries()  # an earlier test's
    trainer.set_scale(1.5)
    os.kill(pid, signal.SIGSTOP)
    try:
        trainer.timeout_s = 3.0
        t0 = time.monotonic()
        asyncio.run(sync_weights(trainer, pool, version))
        took = time.monotonic() - t0
    finally:
        trainer.timeout_s = None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert took < 3.0 + 30, took  # the time limit once, then the live worker's buckets
    assert pool.slots.restarts == restarts + 1 and pool.workers[1] is not hung
    assert ray.get(pool.workers[0].ping.remote())["weight_version"] == version  # the push reached the live one
    both_workers_serve(pool, gates, version, 1.5, seed=5)
    assert the_recovery(pool, pid)["during"] == f"weight push {version}"


def test_beside_training_a_dead_workers_share_runs_again_on_the_weights_the_batch_started_on(setting):
    """one_step_off: the trainer trains while a batch generates, so a replacement gets newer weights
    than the batch's. A worker killed mid-batch: its share waits for the live worker, though the
    replacement is up and idle first, and its trajectory has the batch's weights (scale 1.5), not the
    trainer's newer ones (scale 4) that the replacement holds. Without the hold it would run there."""
    import signal

    from toolrl.processes import sync_weights

    pool, trainer, gates = setting
    version, old_scale = pool.slots.weight_version, trainer.scale
    pool.take_recoveries()  # an earlier test's
    pool.trains_beside_batches = True
    try:
        async def scenario() -> tuple[list[Any], int, Any]:
            batch = asyncio.ensure_future(pool.run([sample("h0", 0), sample("h1", 1)], 1, seed=11, id_prefix="t4-"))
            first = await asyncio.to_thread(wait_for, lambda: waiting_pid(gates, "h0"))
            await asyncio.to_thread(wait_for, lambda: waiting_pid(gates, "h1"))
            slot = next(s for s in pool.slots if s.info["pid"] == first)
            trainer.set_scale(4.0)  # a step trained meanwhile
            os.kill(first, signal.SIGKILL)
            await asyncio.to_thread(wait_for, lambda: slot.info is not None and slot.info["pid"] != first, 120)
            await asyncio.sleep(1.0)  # the replacement, up and idle, is not sent the dead share
            assert waiting_pid(gates, "h0", {first}) is None
            (gates / "h0").touch()
            (gates / "h1").touch()
            return await batch, first, slot

        trajs, killed, slot = asyncio.run(scenario())
    finally:
        pool.trains_beside_batches = False
    assert pool.rerun_groups >= 1 and all(t.turns == 2 and t.error is None for t in trajs)
    assert [t.policy_versions for t in trajs] == [[version, version]] * 2
    assert all(lp == pytest.approx(logprob_at(old_scale), abs=1e-3)
               for t in trajs for turn in turn_logprobs(t) for lp in turn)
    assert ray.get(slot.actor.ping.remote())["finished"] == 0  # the replacement ran nothing
    assert the_recovery(pool, killed)["during"] == "a share of 1 groups"
    asyncio.run(sync_weights(trainer, pool, version + 1))  # both on the trainer's weights again
    both_workers_serve(pool, gates, version + 1, 4.0, seed=12)


# -- the controller on Ray ------------------------------------------------------------------------


def staleness_of_run(out: Path, steps: int) -> list[int]:
    """``(step - 1) - policy_version`` of every trajectory the run traced (the first version of one
    whose weights changed mid-trajectory)."""
    found = []
    for step in range(1, steps + 1):
        for line in (out / "rollouts" / f"step_{step:05d}.jsonl").read_text().splitlines():
            version = json.loads(line)["policy_version"]
            found.append(step - 1 - (version if isinstance(version, int) else version[0]))
    return found


# long: staleness within the bound is test_async.py::test_streaming_staleness_stays_within_the_bound's (slow), weights
# pushed to Ray workers between turns this module's default tests'; this runs both together, two minutes.
@pytest.mark.slow
@pytest.mark.long
def test_train_with_max_staleness_on_ray(tmp_path):
    """The issue's command, with two rollout workers and two trainer ranks: every trajectory is at most
    one update stale, and some are (the rollouts overlapped training)."""
    from _dists import run_toolrl

    out, steps = tmp_path / "run", 4
    res = run_toolrl("train", TINY, "trainer.max_staleness=1", "ray.address=local", "ray.num_rollout_workers=2",
                     "trainer.world_size=2", f"trainer.total_steps={steps}", f"trainer.output_dir={out}",
                     "trainer.progress=false", "trainer.plot=false",
                     env={"OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    placement = json.loads((out / "placement.json").read_text())
    assert (len(placement["trainer"]), len(placement["rollout_workers"])) == (2, 2), placement
    staleness = staleness_of_run(out, steps)
    assert len(staleness) == steps * 8 and set(staleness) <= {0, 1} and 1 in staleness
