"""Loading a verifiers environment: the options that name it, the taskset they load (once per process),
and its tasks as toolrl samples.

A verifiers 0.4.0 environment is a *taskset* (``vf.Taskset``: tasks with their data, ``@vf.reward`` /
``@vf.metric`` methods, judges and toolsets) played by an agent *harness*. toolrl's agent loop is the
harness here, so only the taskset is loaded, from ``module``:

- a module with a ``load_environment(**args)`` function (the environment-package convention) that
  returns a ``vf.Env`` (its taskset is used) or a ``vf.Taskset``; or
- a taskset id as verifiers resolves it (``vf.load_taskset``): a module exporting its ``Taskset``
  subclass in ``__all__`` (an installed environment package, or ``verifiers.v1.tasksets.<id>``),
  configured with ``args`` (its ``TasksetConfig`` fields).

Every failure to load is a ValueError with a one-line message (the environment's ``configure``
turns it into the config error that names ``env_options``).
"""

from __future__ import annotations

import functools
import importlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

TASK_KEY = "verifiers"  # the samples' extra_info key that holds the task's wire data


class VerifiersOptions(BaseModel):
    """``env_options`` of the ``verifiers`` environment."""

    model_config = ConfigDict(extra="forbid")

    module: str = Field(min_length=1, description="a module exposing load_environment(**args), or a "
                        "verifiers taskset id (a module exporting a vf.Taskset subclass in __all__)")
    args: dict[str, Any] = Field(default_factory=dict, description="load_environment's keyword arguments, "
                                 "or the taskset config's fields")
    select: dict[str, Any] = Field(default_factory=dict, description="the train split: a vf.SelectConfig "
                                   "(include, exclude, shuffle, seed, skip, limit); default every task")
    test_select: dict[str, Any] | None = Field(None, description="the test split (a vf.SelectConfig); "
                                               "none when unset")
    parser: str = Field("hermes", description="the tool-call parser the rollouts and the rubric's "
                        "reading of the turns use")
    max_turns: int | None = Field(None, gt=0)

    def key(self) -> str:
        return json.dumps({"module": self.module, "args": self.args}, sort_keys=True, default=str)


@dataclass(frozen=True)
class ToolsetSpec:
    """One verifiers toolset: ``shared`` (taskset-scoped, one instance for every rollout) or built
    per rollout (``Task.toolsets``); ``tools`` maps each advertised name to its method's name."""

    server: str
    shared: bool
    tools: dict[str, str]


@dataclass(frozen=True)
class Loaded:
    """A loaded taskset: its task class and config, and its toolsets."""

    taskset: Any
    task_cls: type
    task_config: Any
    toolsets: tuple[ToolsetSpec, ...]

    def task(self, data: dict[str, Any]) -> Any:
        """The task whose wire data a sample carries."""
        return self.task_cls(self.task_cls.data_type().model_validate(data), self.task_config)

    def new_toolsets(self, shared: bool) -> list[Any]:
        """Fresh toolset instances: the taskset's (``shared``) or one rollout's."""
        if shared:
            return list(type(self.taskset).toolsets(self.taskset.config))
        return list(self.task_cls.toolsets(self.task_config))


def load(options: VerifiersOptions) -> Loaded:
    """The taskset ``options`` name, loaded once per process."""
    return _load(options.key())


@functools.lru_cache(maxsize=16)
def _load(key: str) -> Loaded:
    spec = json.loads(key)
    module, args = spec["module"], spec["args"]
    taskset = _taskset(module, args)
    task_cls = type(taskset).task_type()
    specs = [_toolset_spec(t, True) for t in type(taskset).toolsets(taskset.config)]
    specs += [_toolset_spec(t, False) for t in task_cls.toolsets(taskset.config.task)]
    names = [n for s in specs for n in s.tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"verifiers {module!r}: two toolsets advertise {', '.join(duplicates)}")
    return Loaded(taskset, task_cls, taskset.config.task, tuple(specs))


def _taskset(module: str, args: dict[str, Any]) -> Any:
    import verifiers.v1 as vf

    where = f"verifiers {module!r}"
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError:
        imported = None  # a taskset id that is not a module name (hub ids): verifiers resolves it
    except Exception as exc:  # the module's own import-time error
        raise ValueError(f"{where}: cannot import: {type(exc).__name__}: {_one_line(exc)}") from None
    factory = getattr(imported, "load_environment", None)
    try:
        if callable(factory):
            made = factory(**args)
        else:
            config = vf.taskset_config_type(module).model_validate({**args, "id": module})
            made = vf.load_taskset(config)
    except Exception as exc:  # whatever the environment's own code raises: one line, never a traceback
        what = "load_environment" if callable(factory) else "loading the taskset"
        raise ValueError(f"{where}: {what} failed: {type(exc).__name__}: {_one_line(exc)}") from None
    if isinstance(made, vf.Env):
        made = made.taskset
    if not isinstance(made, vf.Taskset):
        raise ValueError(f"{where}: load_environment returned {type(made).__name__}, not a vf.Env or vf.Taskset")
    return made


def _toolset_spec(toolset: Any, shared: bool) -> ToolsetSpec:
    from verifiers.v1.utils.decorators import discover_decorated

    server = toolset.server_name
    tools = {}
    for fn in discover_decorated(toolset, "tool"):
        name = getattr(fn, "tool_name", None) or fn.__name__
        tools[f"{server}_{name}" if server else name] = fn.__name__
    if not tools:
        raise ValueError(f"toolset {type(toolset).__name__} has no @vf.tool methods (toolsets that proxy "
                         "other servers are not supported)")
    if toolset.config.url:
        raise ValueError(f"toolset {type(toolset).__name__} is remote (url {toolset.config.url}): not supported")
    return ToolsetSpec(server, shared, tools)


# -- tasks as samples --------------------------------------------------------------------------------


def task_rows(options: VerifiersOptions, split: str) -> list[dict[str, Any]]:
    """The rows of ``split`` (the options' ``select`` or ``test_select`` of the taskset's tasks)."""
    import verifiers.v1 as vf

    loaded = load(options)
    if split != "train" and options.test_select is None:
        raise ValueError(f"verifiers {options.module!r} has no test split: choose its tasks with "
                         "env_options.test_select (a vf.SelectConfig: include, exclude, shuffle, seed, skip, limit)")
    chosen = options.select if split == "train" else options.test_select
    try:
        view = loaded.taskset.select(vf.SelectConfig.model_validate(chosen or {}))
        if not view.bounded:
            raise ValueError("the taskset is infinite: bound it with select.limit")
        tasks = list(view)
    except ValueError as exc:
        raise ValueError(f"verifiers {options.module!r} {split}: {_one_line(exc)}") from None
    return [task_row(task) for task in tasks]


def task_row(task: Any) -> dict[str, Any]:
    """One task as a verl row: its system prompt and prompt, its wire data (``extra_info.verifiers``,
    which the session rebuilds the task from), ``answer`` as the
    ground truth where the task data has one."""
    data = task.data
    where = f"task {data.idx}" + (f" ({data.name})" if data.name else "")
    if not data.prompt:
        raise ValueError(f"{where}: no prompt (tasks whose user opens the conversation need a user "
                         "simulator: not supported)")
    prompt = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    messages = [{"role": "user", "content": data.prompt}] if isinstance(data.prompt, str) else \
        [_message(m, where) for m in data.prompt]
    wire = data.model_dump(mode="json", exclude_none=True)
    return {
        "prompt": prompt + messages,
        "reward_model": {"ground_truth": getattr(data, "answer", None)},
        "data_source": "verifiers",
        "extra_info": {"index": data.idx, TASK_KEY: wire},
    }


def _message(message: Any, where: str) -> dict[str, Any]:
    out = message.model_dump(mode="json", exclude_none=True, exclude={"provider_state", "reasoning_content"})
    if out.get("tool_calls"):
        out["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}}
                             for c in out["tool_calls"]]
    if isinstance(out.get("content"), list) and any(p.get("type") != "text" for p in out["content"]):
        raise ValueError(f"{where}: only text content is supported in prompts")
    return out


def _one_line(exc: Exception) -> str:
    """An exception's text on one line, as the config error it goes into is."""
    return " ".join(str(exc).split())
