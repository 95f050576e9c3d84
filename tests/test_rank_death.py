"""A trainer rank's death as the groups read it (toolrl.processes.recovery): :class:`RankDied` carries who
died and during what as fields, and a re-forming group names the rank from them, not from the message's
text. No Ray cluster: the ranks' results and the new group are stand-ins."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from toolrl.processes import recovery
from toolrl.processes.ray_actors import ActorDied
from toolrl.processes.recovery import RankDied, ReformingGroup


def test_a_rank_that_dies_in_a_call_is_rank_died_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray")  # every_rank reads Ray's task errors

    async def result(ref: str) -> Any:
        if ref == "dead":
            raise ActorDied(None, "the actor died unexpectedly", unavailable=True)
        await asyncio.sleep(3600)  # the live rank, blocked in a collective with the dead one

    monkeypatch.setattr(recovery, "result", result)
    infos = [{"pid": 11, "host": "node-a"}, {"pid": 22, "host": "node-b"}]
    with pytest.raises(RankDied) as died:
        asyncio.run(recovery.every_rank(["live", "dead"], "step 3", infos))
    assert (died.value.who, died.value.during, died.value.rank, died.value.unavailable) == (
        "trainer rank 1 (pid 22 on node-b)", "step 3", 1, True)
    assert str(died.value) == "trainer rank 1 (pid 22 on node-b) died during step 3"


def test_a_reform_names_the_dead_rank_from_its_fields(caplog: pytest.LogCaptureFixture) -> None:
    group = ReformingGroup()
    group.config = SimpleNamespace(trainer=SimpleNamespace(on_rank_failure="replace", recovery_timeout_s=5.0))
    group.world_size, group.infos = 2, [{"rank": 0, "node_id": "n0"}, {"rank": 1, "node_id": "n1"}]
    group._init_recovery()

    async def new_group(mode: str, unreachable: str | None = None) -> str:
        assert (mode, unreachable) == ("replace", None)
        return "memory (step 2)"

    group._new_group = new_group
    with caplog.at_level(logging.WARNING, logger=recovery.__name__):
        asyncio.run(group._reform(RankDied("trainer rank 1 (pid 22 on node-b)", "step 3", 1), "step 3"))
    [record] = group.recoveries
    assert (record.died, record.during, record.source, record.node) == (
        "trainer rank 1 (pid 22 on node-b)", "step 3", "memory (step 2)", "n1")
    assert "trainer rank 1 (pid 22 on node-b) died during step 3: re-forming the trainer group (replace)" in caplog.text
