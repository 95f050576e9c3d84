"""At load: 32 episodes open at once on one server through the session machinery the rollout uses
(toolrl.sessions.SessionRun), none lost, each WebSocket without permessage-deflate (its zlib state was
most of an open session's client memory) unless ``ws_compression`` asks for it. The ladder itself (16 to
1024 sessions) is ``benchmarks/env_load.py``."""

from __future__ import annotations

import asyncio

from toolrl.schemas import Sample, ToolCall
from toolrl.sessions import SessionKind, SessionRun
from toolrl.trajectory import Trajectory


async def open_and_step(kind: SessionKind, i: int) -> tuple[SessionRun, list[str]]:
    run = SessionRun(kind, f"t{i}")
    await run.reset(Sample.model_validate({"prompt": "Reach the target.", "index": i,
                                           "extra_info": {"reset_kwargs": {"target": 100}}}))
    assert run.error is None, run.error
    texts = []
    for amount in (i, 1):
        texts.append((await run.step(ToolCall(name="deposit", arguments={"amount": amount}))).response.text)
    return run, texts


async def test_sessions_at_once_none_lost_and_no_deflate_state(ledger) -> None:
    for compression in (False, True):
        kind = SessionKind.resolve("openenv", {"base_url": ledger.base_url, "ws_compression": compression}, ".")
        await kind.prepare()
        n = 32 if not compression else 2
        try:
            opened = await asyncio.gather(*(open_and_step(kind, i) for i in range(n)))
            assert [texts for _, texts in opened] == [[str(i), str(i + 1)] for i in range(n)]  # none lost or mixed
            extensions = {len(run.session.episode.client._ws.protocol.extensions) for run, _ in opened}
            assert extensions == ({1} if compression else {0})
            slots = await kind.shared.get("slots", None)
            assert slots.held == n
            for run, _ in opened:
                traj = Trajectory(trajectory_id="t", sample_index=0, group=0, prompt_ids=[])
                await run.finish(traj)
                assert traj.error is None
            assert slots.held == 0
        finally:
            await kind.close()
