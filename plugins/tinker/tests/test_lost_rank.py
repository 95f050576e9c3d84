"""A trainer rank of the two-rank service killed (SIGKILL) while a client's request runs: the request is
made again on a group re-formed from what the service kept (each adapter's state after its last step, its
gradients as a failed request set them back, and the calls since), and the client gets, bit for bit, what a
client making the same calls on the uninterrupted service gets; its later requests too."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
from conftest import BASE, KEY, held

TOKENS = [3, 17, 99, 2048, 5, 77, 1023, 64, 8, 300, 41, 9, 12, 600, 7, 4000]


def _data(seed: int, count: int = 6) -> list[Any]:
    from tinker import types

    rng = np.random.default_rng(seed)
    data = []
    for n in rng.integers(4, len(TOKENS), count):
        data.append(types.Datum(model_input=types.ModelInput.from_ints(TOKENS[:n - 1]),
                                loss_fn_inputs={"target_tokens": np.array(TOKENS[1:n], np.int64),
                                                "logprobs": rng.uniform(-12.5, -11.0, n - 1).astype(np.float32),
                                                "advantages": rng.normal(0, 1, n - 1).astype(np.float32)}))
    return data


def _overflowing() -> Any:
    """A datum whose importance-sampling loss is infinite: the request fails, its gradient set back."""
    from tinker import types

    return types.Datum(model_input=types.ModelInput.from_ints(TOKENS[:4]),
                       loss_fn_inputs={"target_tokens": np.array(TOKENS[1:5], np.int64),
                                       "logprobs": np.full(4, -1e30, np.float32), "advantages": np.ones(4, np.float32)})


def _calls(tc: Any) -> list[Any]:
    """forward_backward, optim_step, forward_backward, one that fails (its gradient set back on every rank),
    another (of 12 datums: the one a rank is killed in), an optim_step and a forward: what each gave."""
    import tinker
    from tinker import types

    step = types.AdamParams(learning_rate=1e-2)
    seen = [tc.forward_backward(_data(1), "ppo").result(), tc.optim_step(step).result(),
            tc.forward_backward(_data(2), "ppo").result()]
    with pytest.raises(tinker.RequestFailedError, match="the loss of this request is"):
        tc.forward_backward([_overflowing()], "importance_sampling").result()
    seen += [tc.forward_backward(_data(3, count=12), "ppo").result(), tc.optim_step(step).result(),
             tc.forward(_data(4), "ppo").result()]
    return [(s.metrics, [o["logprobs"].to_numpy().tolist() for o in s.loss_fn_outputs]) if hasattr(s, "loss_fn_outputs")
            else s.metrics for s in seen]


def test_a_rank_killed_mid_request_leaves_the_client_results_unchanged(served_two: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import tinker

    client = tinker.ServiceClient(base_url=served_two.url, api_key=KEY)
    uninterrupted = client.create_lora_training_client(base_model=BASE, rank=4, seed=31).result()
    killed = client.create_lora_training_client(base_model=BASE, rank=4, seed=31).result()
    run, trainer = held(served_two, killed.model_id)
    before = list(trainer.ranks.recoveries)
    victim = trainer.ranks.infos[1]["pid"]
    # The 12-datum forward_backward's pass on the ranks as the server runs it (when it began and ended):
    # the rank is killed once it has begun, and the kill must land before it ends.
    inside, began, ended, killed_at = threading.Event(), [], [], []
    step = trainer.step

    def watched(r: Any, rows: Any, *args: Any, **kwargs: Any) -> Any:
        if r.adapter != run.adapter or len(rows) != 12:
            return step(r, rows, *args, **kwargs)
        began.append(time.time())
        inside.set()
        try:
            return step(r, rows, *args, **kwargs)
        finally:
            ended.append(time.time())

    monkeypatch.setattr(trainer, "step", watched)

    def kill() -> None:
        if inside.wait(120):
            os.kill(victim, signal.SIGKILL)
            killed_at.append(time.time())

    killer = threading.Thread(target=kill)
    killer.start()
    got = _calls(killed)
    killer.join()
    monkeypatch.undo()
    expected = _calls(uninterrupted)
    recoveries = trainer.ranks.recoveries[len(before):]
    assert len(recoveries) == 1 and recoveries[0].died.startswith("trainer rank 1")
    assert trainer.ranks.infos[1]["pid"] != victim
    # The kill landed inside the request, and the group was re-formed for it, not for a later call.
    assert len(began) == len(ended) == 1 and len(killed_at) == 1
    assert began[0] < killed_at[0] < ended[0], "the rank was killed after the request's pass had ended"
    assert recoveries[0].during == f"forward_backward of {run.adapter}"
    assert began[0] < recoveries[0].time < ended[0]
    assert repr(got) == repr(expected)  # every loss, log-prob and norm, bit for bit
    for name, read in (("adapter and AdamW", lambda held_run: trainer.ranks.state(held_run.adapter)), ("gradients", trainer.gradients)):
        mine, theirs = (read(held(served_two, tc.model_id)[0]) for tc in (killed, uninterrupted))
        assert repr(_flat(mine)) == repr(_flat(theirs)), name
    client.close("success")


def _flat(value: Any) -> Any:
    """Tensors as lists of their values, to compare nested states whole."""
    if isinstance(value, dict):
        return {k: _flat(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value
