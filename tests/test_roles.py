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
    tree = ast.parse((CORE / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("toolrl"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("toolrl"))
    return found


@pytest.mark.parametrize("module", ["roles/in_process", "roles/rollout_workers", "roles/trainer_rank",
                                    "roles/trainer_group", "roles/ray_actors", "training/sharding",
                                    "training/weight_sync", "training/export", "roles/__init__",
                                    "roles/evaluate", "roles/replay", "data/recorded"])
def test_no_role_imports_the_controller(module):
    assert "toolrl.roles.controller" not in toolrl_imports(module), f"{module} imports the controller"


def test_bucketed_sync_reaches_an_engine_with_its_own_model(tiny_qwen3_path):
    """Small buckets, an engine that loaded its own copy: every weight arrives, tied ones once, and
    the peak held is one bucket plus the tensor being added, not the model."""
    import torch
    from toolrl.engines import ModelSource
    from toolrl.engines.transformers import TransformersEngine
    from toolrl.model_sources import load_model
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
    # The final bucket carries last=True (no empty bucket after it: one call less per sync).
    assert stats.buckets == len(calls) > 3 and [last for _, last in calls] == [False] * (len(calls) - 1) + [True]
    assert calls[-1][0]
    # No copies on CPU: the buckets hold the trainer's own tensors.
    assert stats.peak_bytes == 0 and stats.bytes_sent == sum(p.numel() * 4 for p in trainer.parameters())


def test_default_bucketed_update_collects_then_loads_once():
    from toolrl.testing import ScriptedEngine

    class Recorder(ScriptedEngine):
        loads: list[dict[str, Any]] = []

        def update_weights(self, state_dict):
            self.loads.append(dict(state_dict))

    engine = Recorder(None, [""])
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
    from toolrl.roles.start import start_roles

    cfg = load_config(str(CORE.parents[1] / "examples" / "tiny.yaml"), ["trainer.world_size=2"])
    with pytest.raises(ConfigError, match=r"trainer.world_size=2 needs Ray: set ray.address"):
        asyncio.run(start_roles(cfg))


# -- the roles' interfaces --------------------------------------------------------------------------

IMPLEMENTATIONS = [("TrainerGroup", "toolrl.roles.trainer_group", "LocalTrainer"),
                   ("TrainerGroup", "toolrl.roles.trainer_group", "RayTrainerGroup"),
                   ("RolloutGroup", "toolrl.roles.in_process", "Rollouts"),
                   ("RolloutGroup", "toolrl.roles.rollout_workers", "RolloutWorkerPool"),
                   ("RolloutGroup", "toolrl.roles.replay", "Replay")]


@pytest.mark.parametrize(("protocol", "module", "name"), IMPLEMENTATIONS, ids=[i[2] for i in IMPLEMENTATIONS])
def test_each_implementation_has_its_protocols_signatures(protocol, module, name):
    """Every method of the role's protocol, on the class, with the same parameters (names, kinds,
    defaults, annotations), return annotation and async-ness; every property as a property or
    (checked on instances below) an attribute."""
    import importlib
    import inspect

    import toolrl.roles
    from typing_extensions import get_protocol_members

    proto = getattr(toolrl.roles, protocol)
    cls = getattr(importlib.import_module(module), name)
    members = get_protocol_members(proto)
    assert {"close", "run" if protocol == "RolloutGroup" else "step"} <= members
    for member in sorted(members):
        want, got = inspect.getattr_static(proto, member), inspect.getattr_static(cls, member, None)
        if isinstance(want, property):
            assert got is None or isinstance(got, property), f"{name}.{member}"
            continue
        assert callable(got), f"{name} has no method {member}"
        assert inspect.iscoroutinefunction(got) == inspect.iscoroutinefunction(want), f"{name}.{member}: async-ness"
        assert inspect.signature(got) == inspect.signature(want), f"{name}.{member}{inspect.signature(got)}"


def test_in_process_roles_satisfy_the_protocols(tiny_qwen3_path):
    import asyncio

    from toolrl.config import load_config
    from toolrl.roles import RolloutGroup, TrainerGroup
    from toolrl.roles.replay import Replay
    from toolrl.roles.start import start_roles

    async def scenario() -> None:
        roles = await start_roles(load_config(str(CORE.parents[1] / "examples" / "tiny.yaml")))
        try:
            replay = Replay(roles.rollouts)
            assert isinstance(roles.trainer, TrainerGroup)
            assert isinstance(roles.rollouts, RolloutGroup) and isinstance(replay, RolloutGroup)
            assert roles.rollouts.generating is roles.rollouts and replay.generating is roles.rollouts
            engine = roles.rollouts.weight_targets(1)[0]
            assert replay.weight_targets(1) == [engine] and engine.weight_version == 0
            # The controller's sync: into the engine sharing the trainer's module, labelled 1.
            sync = await roles.sync_weights(1)
            assert engine.weight_version == 1 and set(sync) == {"weight_sync_s", "weight_sync_peak_mb"}
            with pytest.raises(ValueError, match="cannot be replaced"):
                replay.replace([engine])
        finally:
            await roles.close()

    asyncio.run(scenario())
