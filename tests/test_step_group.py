"""The public step group (toolrl.processes.step_group.StepGroup) on a real Ray on loopback, one rank of the
tiny model: a rank that raises fails the call with TrainerFailed (one line naming the rank) and leaves the
group as it was; the next call re-forms the group (a new rank, recorded in ``recoveries``) in the state from
before the failed call, and succeeds. A rank that dies: plugins/tinker/tests/test_lost_rank.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from toolrl.config import AdapterConfig, RayConfig
from toolrl.processes.recovery import TrainerFailed
from toolrl.processes.step_group import StepGroup
from toolrl.ray_cluster import init_ray
from toolrl.training.optimizer import OptimizerSettings
from toolrl.training.token_step import LossSpec, TokenRow

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a Ray instance and a rank started twice: tens of seconds on two shared cores

TOKENS = [3, 17, 99, 2048, 5, 77, 1023]
LORA = AdapterConfig(r=2, alpha=16.0, target_modules=["q_proj", "v_proj"])


@pytest.fixture(scope="module")
def group(tiny_qwen3_path):
    """A started group of one rank on a local Ray of this module's own (shut down after it)."""
    if ray.is_initialized():
        pytest.fail("a Ray connection from an earlier test is still open")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        init_ray("local", 1, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}}, log_to_driver=False)
        made = StepGroup(tiny_qwen3_path, 1, RayConfig(address="local"))
        try:
            made.start(timeout_s=300)
            yield made
        finally:
            made.close()
            ray.shutdown()


def test_a_rank_that_raises_fails_the_call_and_the_next_call_reforms_the_group(group) -> None:
    rng = np.random.default_rng(0)
    n = len(TOKENS) - 1
    row = TokenRow(tokens=TOKENS[:-1], targets=TOKENS[1:], advantages=rng.normal(0, 1, n),
                   logprobs=rng.uniform(-12.5, -11.0, n))
    group.add_adapter("a", LORA, seed=1)
    group.forward_backward("a", [row], LossSpec(name="ppo_clip"))  # a gradient pending, no step yet
    pending = group.gradients("a")
    assert all(g is not None for g in pending.values())
    pid, before = group.infos[0]["pid"], len(group.recoveries)

    # Gradients of a shape no weight has: the group passes them on, the rank raises assigning them.
    with pytest.raises(TrainerFailed) as failed:
        group.set_gradients("a", {k: torch.zeros(1) for k in pending})
    assert type(failed.value) is TrainerFailed  # raised, not died (RankDied: re-formed within the call)
    message = str(failed.value)
    assert message.startswith(f"trainer rank 0 (pid {pid} on ") and "failed during set gradients: RuntimeError" in message
    assert "\n" not in message
    assert len(group.recoveries) == before and group.infos[0]["pid"] == pid  # not re-formed yet

    # The next call re-forms the group (a new rank) in the state from before the failed call, and succeeds.
    again = group.gradients("a")
    assert group.infos[0]["pid"] != pid
    [recovery] = group.recoveries[before:]
    assert (recovery.died, recovery.during, recovery.mode, recovery.what) == ("a failed call", "reading a", "replace",
                                                                             "step_rank")
    assert recovery.source == "memory (1 adapters, 1 calls since their last step run again)"
    assert again.keys() == pending.keys() and all(torch.equal(again[k], pending[k]) for k in pending)
    norm = group.optimizer_step("a", OptimizerSettings(lr=1e-2))
    assert math.isfinite(norm)  # measured, clipped or not
    assert group.recoveries[before:] == [recovery]  # the group trains on, once re-formed
