"""A fleet over two Ray nodes: the ``fleet`` session kind starts its environment servers as Ray actors
(``ray_servers``, 1 CPU each), one on each node of a two-node cluster on loopback (``ray start --head``,
then ``ray start --address``, as tests/test_node_loss.py does); the second node is lost mid-run (its raylet and
everything it started killed -9). The sessions its server held are masked, none on the head is lost,
Ray starts the actor again on the head, and new trajectories reach the server there.

Marked ``long`` (a Ray cluster of two nodes on 2 cores), and run from a checkout (the core's tests start
the cluster): ``pytest -m long plugins/fleet/tests/test_fleet_nodes.py``, or ``nox -s long``."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest
import toolrl.plugins
from support import REPO, counter_session, install
from test_fleet import GOAL, finish, opened, server_of, step
from toolrl.plugins import Plugins
from toolrl.sessions import SessionKind

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")
sys.path.append(str(REPO / "tests"))  # the core's tests: their two-node cluster on loopback
from test_node_loss import two_nodes  # noqa: E402 (needs ray)
from toolrl.ray_cluster import init_ray  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.long]


def server_ports(pids: set[int]) -> set[int]:
    """The ports of the ``toolrl env serve`` processes among ``pids``."""
    ports = set()
    for pid in pids:
        try:
            line = " ".join(psutil.Process(pid).cmdline())
        except psutil.NoSuchProcess:
            continue
        if "env serve" in line:
            ports.add(int(re.search(r"--port (\d+)", line).group(1)))
    return ports


def descendants(pids: set[int]) -> set[int]:
    found = set(pids)
    for pid in pids:
        try:
            found |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.mark.timeout(900)
def test_a_lost_node_takes_only_its_servers_sessions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(tmp_path, "counter", counter_session())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(toolrl.plugins, "_plugins", Plugins(env={}))
    # The nodes import toolrl and this plugin as this process does (a checkout's, or the installed ones).
    pythonpath = os.pathsep.join(filter(None, [str(REPO / "core"), str(REPO / "plugins" / "fleet"), str(tmp_path),
                                               os.environ.get("PYTHONPATH")]))
    # Both nodes with room for a server actor of 1 CPU, and the head for the second node's once it is lost.
    with two_nodes(pythonpath, head=("--num-cpus=2",), node2=("--num-cpus=1",), object_store=200_000_000) as cluster:
        init_ray(cluster.address, 0, runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}})
        asyncio.run(lose_the_second_node(cluster))


async def lose_the_second_node(cluster) -> None:
    kind = SessionKind.resolve("fleet", {"serve": "counter", "serve_options": GOAL, "ray_servers": 2,
                                         "ray_num_cpus": 1, "retry_s": 0.5, "queue_timeout_s": 120}, ".")
    await kind.prepare()
    try:
        members = (await kind.shared.get("fleet", None)).members
        on_node2 = server_ports(descendants(cluster.node2_pids))
        assert len(on_node2) == 1 and {int(m.url.rsplit(":", 1)[1]) for m in members} >= on_node2  # one per node
        runs = await asyncio.gather(*(opened(kind, i) for i in range(8)))
        assert await asyncio.gather(*(step(r, 2) for r in runs)) == ["2"] * 8
        lost_member = next(m for m in members if int(m.url.rsplit(":", 1)[1]) in on_node2)

        cluster.kill_node2()
        after = await asyncio.gather(*(step(r, 3) for r in runs))
        for run, text in zip(runs, after):
            if server_of(run) is lost_member:  # masked
                assert text is None and run.infrastructure
            else:  # none lost on the head
                assert text == "5" and run.error is None
        assert sum(server_of(r) is lost_member for r in runs) == 4
        await asyncio.gather(*(finish(r) for r in runs))

        taken = lost_member.taken
        for i in range(240):  # Ray starts the actor again on the head; the fleet reads its new address
            again = await opened(kind, 20 + i)  # each new trajectory's connect asks the down server again
            assert await step(again, 1) == "1"  # and none fails meanwhile: the head's server takes them
            await finish(again)
            if lost_member.taken > taken:
                break
            await asyncio.sleep(0.5)
        assert lost_member.up and lost_member.losses == 1 and lost_member.taken > taken  # the run goes on, server back
        assert int(lost_member.url.rsplit(":", 1)[1]) not in on_node2
    finally:
        await kind.close()
