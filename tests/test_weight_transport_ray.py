"""Weight transports in a training run on Ray: two trainer ranks (FSDP2) and two rollout workers train
three steps to the same figures with ``trainer.weight_transport=broadcast`` (each rank sends its own
shards over its own gloo group) as with the object store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # two 3-step Ray runs: minutes on a loaded machine

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny.yaml")


def train(out: Path, plugin: Path, *overrides: str) -> list[dict]:
    from _dists import run_toolrl

    res = run_toolrl("train", TINY, "reward.functions=[{name: even_tokens}]", "ray.address=local", "ray.num_rollout_workers=2", "trainer.world_size=2",
                     "trainer.total_steps=3", f"trainer.output_dir={out}", "trainer.progress=false",
                     "trainer.plot=false", "trainer.weight_sync_bucket_mb=1", "rollout.max_new_tokens=16", *overrides,
                     path=plugin, env={"OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_broadcast_trains_to_the_same_figures_as_the_object_store(tmp_path):
    """With the even_tokens reward (a random model's task rewards are all 0) every step has a gradient,
    so the weights each sync carries differ from the last."""
    from _dists import EVEN_TOKENS, make_dist

    plugin = tmp_path / "plugin"
    plugin.mkdir()
    make_dist(plugin, "even-tokens", "even", "even_tokens_plugin", EVEN_TOKENS)
    want = train(tmp_path / "object_store", plugin)
    got = train(tmp_path / "broadcast", plugin, "trainer.weight_transport=broadcast")
    assert [m["step"] for m in got] == [1, 2, 3]
    assert all(m["reward_std"] > 0 and m["grad_norm"] > 0 for m in want)
    for a, b in zip(got, want, strict=True):
        assert (a["reward_mean"], a["grad_norm"]) == (b["reward_mean"], b["grad_norm"]), (a["step"], a, b)
        assert a["weight_sync_s"] > 0
