"""A trainer rank's death as the groups read it (toolrl.processes.recovery): :class:`RankDied` carries who
died and during what as fields, and a re-forming group names the rank from them, not from the message's
text; the one recovery loop both groups run. No Ray cluster: the ranks' results and the new group are
stand-ins."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from toolrl.processes import recovery
from toolrl.processes.ray_actors import ActorDied
from toolrl.processes.recovery import RankDied, ReformingGroup, TrainerFailed


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


def _died(rank: int) -> RankDied:
    return RankDied(f"trainer rank {rank}", "step 1", rank)


def _calls(failures: list[Exception], log: list[str]) -> Callable[[], Awaitable[str]]:
    """A call that raises ``failures`` in turn, then succeeds; each attempt logged."""

    async def call() -> str:
        log.append("call")
        if failures:
            raise failures.pop(0)
        return "done"

    return call


def test_one_recovery_loop_re_forms_after_a_death_or_before_the_next_attempt() -> None:
    """recovering: a call made again after each rank death, the group re-formed right after it (the trainer
    group's way) or before each attempt (the step group's, told of every failure first); a failure that is
    not a death is raised at once."""
    log: list[str] = []

    async def reform(death: RankDied) -> None:
        log.append(f"reform {death.rank}")

    assert asyncio.run(recovery.recovering(_calls([_died(1), _died(0)], log), reform=reform)) == "done"
    assert log == ["call", "reform 1", "call", "reform 0", "call"]

    log, broken = [], []

    async def ready() -> None:
        log.append(f"ready {len(broken)}")

    with pytest.raises(TrainerFailed, match="rank 0 raised"):
        asyncio.run(recovery.recovering(_calls([_died(1), TrainerFailed("rank 0 raised"), _died(0)], log),
                                        ready=ready, failed=broken.append))
    assert log == ["ready 0", "call", "ready 1", "call"] and [type(b) for b in broken] == [RankDied, TrainerFailed]


def test_a_death_past_the_limit_or_under_stop_ends_the_call() -> None:
    log: list[str] = []

    async def reform(death: RankDied) -> None:
        log.append("reform")

    with pytest.raises(RankDied) as last:
        asyncio.run(recovery.recovering(_calls([_died(r) for r in range(9)], log), reform=reform))
    assert log.count("call") == recovery.MAX_DEATHS_PER_CALL + 1 and log.count("reform") == recovery.MAX_DEATHS_PER_CALL
    assert last.value.rank == recovery.MAX_DEATHS_PER_CALL
    log.clear()
    with pytest.raises(RankDied):
        asyncio.run(recovery.recovering(_calls([_died(1)], log), reform=reform, stop=True))
    assert log == ["call"]


def test_overlapping_calls_of_the_trainer_group_re_form_it_once() -> None:
    """Two calls in flight on the group a rank died in re-form it once, both run again on the new one; a
    call's second death, on the group it re-formed, re-forms it again."""
    group = ReformingGroup()
    group.config = SimpleNamespace(trainer=SimpleNamespace(on_rank_failure="replace"))
    group._init_recovery()
    reforms: list[str] = []

    async def reform(died: RankDied, what: str) -> None:
        reforms.append(what)
        await asyncio.sleep(0.01)

    group._reform = reform

    async def overlapping() -> list[str]:
        log: list[str] = []
        late: list[Exception] = [_died(1)]

        async def dies_late() -> str:  # its rank's death is seen after the other call re-formed the group
            log.append("late")
            if late:
                await asyncio.sleep(0.05)
                raise late.pop()
            return "done"

        return await asyncio.gather(group._recovering("step 1", _calls([_died(1)], log)),
                                    group._recovering("weight sync", dies_late))

    assert asyncio.run(overlapping()) == ["done", "done"] and reforms == ["step 1"]
    reforms.clear()
    assert asyncio.run(group._recovering("step 2", _calls([_died(0), _died(1)], []))) == "done"
    assert reforms == ["step 2", "step 2"]
