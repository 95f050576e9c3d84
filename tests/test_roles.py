"""Roles without Ray: the module graph has no cycle through the controller, a bucketed weight sync
reaches an engine with its own copy of the model, and the default bucketed update of an engine."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

CORE = Path(__file__).resolve().parents[1] / "core" / "toolrl"


def toolrl_imports(module: str) -> set[str]:
    tree = ast.parse((CORE / module).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("toolrl"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("toolrl"))
    return found


@pytest.mark.parametrize("module", ["roles/compose.py", "roles/rollout_workers.py", "roles/trainer_rank.py",
                                    "roles/trainer_group.py", "training/sharding.py", "training/weight_sync.py",
                                    "training/checkpoint.py", "roles/__init__.py", "roles/evaluate.py",
                                    "data/recorded.py"])
def test_no_role_imports_the_controller(module):
    assert "toolrl.roles.controller" not in toolrl_imports(module), f"{module} imports the controller"


def test_bucketed_sync_reaches_an_engine_with_its_own_model(tiny_qwen3_path):
    """Small buckets, an engine that loaded its own copy: every weight arrives, tied ones once, and
    the peak held is one bucket plus the tensor being added, not the model."""
    import torch
    from toolrl.engines import ModelSource
    from toolrl.engines.transformers import TransformersEngine
    from toolrl.models import load_model
    from toolrl.training.weight_sync import push

    trainer = load_model(tiny_qwen3_path)
    engine = TransformersEngine.create(ModelSource(path=tiny_qwen3_path), {"device": "cpu"})
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.5)
    calls: list[tuple[list[str], bool]] = []

    def sink(bucket: Mapping[str, Any], last: bool) -> int:
        calls.append((list(bucket), last))
        engine.update_weights_bucket(bucket, last)
        return 0

    stats = push(trainer, [sink], bucket_mb=0.05)
    want, got = trainer.state_dict(), engine.model.state_dict()
    assert all(torch.equal(want[k], got[k]) for k in want)
    names = [n for names, _ in calls for n in names]
    assert len(names) == len(set(names)) and "lm_head.weight" not in names  # tied to the embeddings
    assert stats.buckets == len(calls) - 1 > 3 and calls[-1] == ([], True)
    # No copies on CPU: the buckets hold the trainer's own tensors.
    assert stats.peak_bytes == 0 and stats.bytes_sent == sum(p.numel() * 4 for p in trainer.parameters())


def test_default_bucketed_update_collects_then_loads_once():
    from toolrl.engines import RolloutEngine

    class Recorder(RolloutEngine):
        loads: list[dict[str, Any]] = []

        @classmethod
        def create(cls, source, config):
            return cls()

        async def generate(self, prompt_ids, params, n=1, session_id=None):
            raise NotImplementedError

        def update_weights(self, state_dict):
            self.loads.append(dict(state_dict))

    engine = Recorder()
    engine.update_weights_bucket({"a": 1}, False)
    engine.update_weights_bucket({"b": 2}, False)
    assert engine.loads == []
    engine.update_weights_bucket({}, True)
    assert engine.loads == [{"a": 1, "b": 2}]
    engine.update_weights_bucket({"c": 3}, True)  # a new update starts empty
    assert engine.loads[-1] == {"c": 3}


def test_world_size_without_ray_is_a_config_error():
    import asyncio

    from toolrl.config import ConfigError, load_config
    from toolrl.roles import compose_roles

    cfg = load_config(str(CORE.parents[1] / "examples" / "tiny.yaml"), ["trainer.world_size=2"])
    with pytest.raises(ConfigError, match=r"trainer.world_size=2 needs Ray: set ray.address"):
        asyncio.run(compose_roles(cfg))
