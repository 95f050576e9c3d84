"""Roles without Ray: the module graph has no cycle through the controller, an in-process weight sync
reaches an engine with its own copy of the model as rows, the engine contract's default row receiver,
the plan the run check decides for the processes, and no role branching on a weight transport's type."""

from __future__ import annotations

import ast
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


@pytest.mark.parametrize("module", ["processes/in_process", "processes/rollout_workers", "processes/trainer_rank",
                                    "processes/trainer_group", "processes/ray_actors", "training/sharding",
                                    "training/weight_sync", "training/export", "processes/__init__",
                                    "processes/evaluate", "processes/replay", "data/recorded"])
def test_no_role_imports_the_controller(module):
    assert "toolrl.processes.controller" not in toolrl_imports(module), f"{module} imports the controller"


def test_an_in_process_sync_reaches_an_engine_with_its_own_model_as_rows(tiny_qwen3_path):
    """The trainer's weights into an engine that loaded its own copy, as rows (push_local): every weight
    arrives, tied ones once, and nothing is copied on the way (the rows are the trainer's tensors)."""
    import torch
    from toolrl.engines import ModelSource
    from toolrl.engines.transformers import TransformersEngine
    from toolrl.model_sources import load_model
    from toolrl.training.weight_sync import push_local

    trainer = load_model(tiny_qwen3_path)
    engine = TransformersEngine.create(ModelSource(path=tiny_qwen3_path), {"device": "cpu"})
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.5)
    names: list[str] = []
    load = engine.load_weight_rows
    engine.load_weight_rows = lambda name, *rest: (names.append(name), load(name, *rest))  # type: ignore[method-assign]
    with engine.updating_weights(1):
        stats = push_local(trainer, [engine])
    want, got = trainer.state_dict(), engine.model.state_dict()
    assert all(torch.equal(want[k], got[k]) for k in want) and engine.weight_version == 1
    assert len(names) == len(set(names)) and "lm_head.weight" not in names  # tied to the embeddings
    assert stats.peak_bytes == 0 and stats.bytes_sent == sum(p.numel() * 4 for p in trainer.parameters())


def test_default_row_receiver_collects_then_loads_once():
    """An engine that only loads whole tensors (``update_weights``) gets rows assembled by the contract's
    default, loaded once when the update finishes; a new update starts empty."""
    import torch
    from toolrl.testing import ScriptedEngine
    from toolrl.transports.weight_rows import load_rows, whole

    class Recorder(ScriptedEngine):
        loads: list[dict[str, Any]] = []

        def update_weights(self, state_dict):
            self.loads.append(dict(state_dict))

    engine = Recorder(None, [""])
    a = torch.arange(6.0).reshape(3, 2)
    engine.load_weight_rows("a", (3, 2), 0, a[:2])
    engine.load_weight_rows("a", (3, 2), 2, a[2:])
    assert engine.loads == []
    engine.finish_weight_rows()
    assert list(engine.loads[0]) == ["a"] and torch.equal(engine.loads[0]["a"], a)
    load_rows([engine], whole({"c": torch.tensor(3.0)}))
    assert list(engine.loads[-1]) == ["c"] and engine.loads[-1]["c"].item() == 3.0


def test_world_size_without_ray_is_a_config_error():
    import asyncio

    from toolrl.config import ConfigError, load_config
    from toolrl.processes.start import start_processes

    cfg = load_config(str(CORE.parents[1] / "examples" / "tiny.yaml"), ["trainer.world_size=2"])
    with pytest.raises(ConfigError, match=r"trainer.world_size=2 needs Ray: set ray.address"):
        asyncio.run(start_processes(cfg))


@pytest.mark.parametrize(("overrides", "purpose", "adapters", "delta", "state_keys"), [
    ([], "train", False, False, False),
    (["algorithm.advantage=gigpo"], "train", False, False, True),  # gigpo groups turns by their state
    (["algorithm.advantage=gigpo"], "rollout", False, False, True),
    (["trainer.weight_sync=delta"], "train", False, True, False),
    (["trainer.weight_sync=delta"], "rollout", False, False, False),  # nothing trained: no sync to send
    (["model.lora={r: 4}"], "train", True, False, False),
])
def test_the_run_check_decides_the_roles_plan_once(overrides, purpose, adapters, delta, state_keys):
    """What a weight sync sends and whether sessions report their turns' state keys: decided by the run
    check and carried to the roles as it is (a Ray actor gets it pickled)."""
    import pickle

    from toolrl.config import load_config
    from toolrl.processes.resolve import RunPlan, resolve_run
    from toolrl.training.weight_sync import SyncPlan

    plan = resolve_run(load_config(str(CORE.parents[1] / "examples" / "tiny.yaml"), overrides), purpose).plan
    assert plan == RunPlan(SyncPlan(adapters=adapters, delta=delta), state_keys=state_keys)
    assert pickle.loads(pickle.dumps(plan)) == plan


# -- the roles' interfaces --------------------------------------------------------------------------

IMPLEMENTATIONS = [("TrainerGroup", "toolrl.processes.trainer_group", "LocalTrainer"),
                   ("TrainerGroup", "toolrl.processes.trainer_group", "RayTrainerGroup"),
                   ("RolloutGroup", "toolrl.processes.in_process", "Rollouts"),
                   ("RolloutGroup", "toolrl.processes.rollout_workers", "RolloutWorkerPool"),
                   ("RolloutGroup", "toolrl.processes.replay", "Replay")]


@pytest.mark.parametrize(("protocol", "module", "name"), IMPLEMENTATIONS, ids=[i[2] for i in IMPLEMENTATIONS])
def test_each_implementation_has_its_protocols_signatures(protocol, module, name):
    """Every method of the role's protocol, on the class, with the same parameters (names, kinds,
    defaults, annotations), return annotation and async-ness; every property as a property or
    (checked on instances below) an attribute."""
    import importlib
    import inspect

    import toolrl.processes
    from typing_extensions import get_protocol_members

    proto = getattr(toolrl.processes, protocol)
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
    from toolrl.processes import RolloutGroup, TrainerGroup
    from toolrl.processes.replay import Replay
    from toolrl.processes.start import start_processes

    async def scenario() -> None:
        processes = await start_processes(load_config(str(CORE.parents[1] / "examples" / "tiny.yaml")))
        try:
            replay = Replay(processes.rollouts)
            assert isinstance(processes.trainer, TrainerGroup)
            assert isinstance(processes.rollouts, RolloutGroup) and isinstance(replay, RolloutGroup)
            assert processes.rollouts.generating is processes.rollouts and replay.generating is processes.rollouts
            engine = processes.rollouts.weight_targets(1)[0]
            assert replay.weight_targets(1) == [engine] and engine.weight_version == 0
            # The controller's sync: into the engine sharing the trainer's module, labelled 1.
            sync = await processes.sync_weights(1)
            assert engine.weight_version == 1 and set(sync) == {"weight_sync_s", "weight_sync_peak_mb"}
            with pytest.raises(ValueError, match="cannot be replaced"):
                replay.replace([engine])
        finally:
            await processes.close()

    asyncio.run(scenario())


def transport_type_branches(source: str) -> list[int]:
    """Lines of ``source`` that test a value's type against a transport class: ``isinstance``/``issubclass``
    with a class imported from ``toolrl.transports`` (or named ``*Transport``), or ``type(x)`` compared
    with one."""
    tree = ast.parse(source)
    transports = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                  and (node.module or "").startswith("toolrl.transports") for a in node.names}

    def names_transport(node: ast.AST) -> bool:
        parts = node.elts if isinstance(node, ast.Tuple) else [node]
        named = [p.attr if isinstance(p, ast.Attribute) else getattr(p, "id", "") for p in parts]
        return any(n in transports or n.endswith("Transport") for n in named)

    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("isinstance", "issubclass")
                and len(node.args) == 2 and names_transport(node.args[1])) or (isinstance(node, ast.Compare) and isinstance(node.left, ast.Call)
              and getattr(node.left.func, "id", "") == "type" and any(map(names_transport, node.comparators))):
            lines.append(node.lineno)
    return lines


def test_no_role_module_branches_on_a_transports_type():
    """Every weight transport is used the same way (issue #58): no role picks a path by its class."""
    assert transport_type_branches("from toolrl.transports import LinkedTransport\n"
                                   "if isinstance(t, LinkedTransport): pass\n"
                                   "if type(t) is ObjectStoreTransport: pass\n") == [2, 3]
    processes = Path(__file__).resolve().parents[1] / "core" / "toolrl" / "processes"
    found = {p.name: lines for p in sorted(processes.glob("*.py")) if (lines := transport_type_branches(p.read_text()))}
    assert not found, f"role modules branch on a transport's type: {found}"
