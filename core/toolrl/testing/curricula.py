"""Curricula (:mod:`toolrl.curricula`): :func:`play_curriculum` drives a registered curriculum as the controller
does, on a policy that gets better at the easy prompts first, and :func:`check_curriculum` checks it: every
choice a position in the training samples, its figures JSON numbers, and its state carried through JSON at
any step (a checkpoint and ``--resume``) giving the choices it would have made left alone."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from toolrl.curricula import Curriculum, GroupOutcome, TrainingSet
from toolrl.data.draws import finite_figures, json_problem
from toolrl.plugins.parts import BuildContext, build_part
from toolrl.schemas import Sample

SAMPLES = 24  # prompts of the default training set: 8 at each of 3 levels, under one route ("play")


def training_set(samples: int = SAMPLES, levels: Sequence[str] = ("easy", "middle", "hard")) -> TrainingSet:
    """``samples`` prompts of one route (``play``) spread over ``levels``, in turn."""
    made = [Sample(prompt=[{"role": "user", "content": f"task {i}"}], env="play", index=i, level=i % len(levels))
            for i in range(samples)]
    return TrainingSet(made, seed=0, shuffle=True, levels={"play": list(levels)})


def solved(data: TrainingSet, sample: int, step: int, steps: int) -> float:
    """The chance the played policy solves prompt ``sample`` at ``step``: from 0 for every level, rising
    sooner the easier its level (a prompt without one: its position's share of the data)."""
    level, levels = data.samples[sample].level, len(data.levels.get(data.samples[sample].env) or [])
    hardness = level / levels if level is not None and levels else sample / len(data.samples)
    return min(max(2 * step / steps - hardness, 0.0), 1.0)


def play_curriculum(name: str, options: Mapping[str, Any] | None = None, data: TrainingSet | None = None,
                    steps: int = 12, batch: int = 4, n: int = 4, ahead: int = 0,
                    restart: int | None = None) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """Curriculum ``name`` built with ``options`` on ``data`` (:func:`training_set` by default) over ``steps``
    steps of ``batch`` groups of ``n`` trajectories, each step's groups drawn ``ahead`` steps before the step
    trains them (asynchronous training; their outcomes are that stale). ``restart``: at that step the state
    goes through JSON into a newly built curriculum, as a checkpoint and ``--resume`` carry it. Returns each
    step's choices and figures."""
    data = data or training_set()

    def build() -> Curriculum:
        context = BuildContext("data.curriculum.name", "data.curriculum", inputs={"data": data})
        return build_part("curricula", name, options or {}, context)

    curriculum, chosen, choices, figures = build(), {}, [], []
    for step in range(steps + ahead):
        if step == restart:
            state = curriculum.state_dict()
            assert (problem := json_problem(state)) is None, \
                f"{name}: state_dict() returned something that is not JSON: {problem}"
            state = json.loads(json.dumps(state))
            curriculum = build()
            curriculum.load_state_dict(state)
        if step < steps:  # this step's groups, drawn
            groups = range(step * batch, (step + 1) * batch)
            chosen |= {g: curriculum.choose(g) for g in groups}
            choices.append([chosen[g] for g in groups])
        if step >= ahead:  # the groups the step trains (1-based step), observed
            trained = step - ahead
            version = max(trained - ahead, 0)  # the steps trained when its groups were drawn
            for g in range(trained * batch, (trained + 1) * batch):
                p = solved(data, chosen[g], version, steps)
                rewards = tuple(float((g * n + k) * 0.618 % 1 < p) for k in range(n))
                curriculum.observe(GroupOutcome(g, chosen.pop(g), rewards, version, trained + 1))
            figures.append(json.loads(json.dumps(curriculum.metrics())))
    return choices, figures


def check_curriculum(name: str, options: Mapping[str, Any] | None = None, data: TrainingSet | None = None,
                     steps: int = 12, ahead: int = 0) -> list[list[int]]:
    """:func:`play_curriculum` checked: every choice a position in the samples, every figure a finite number,
    and the run restarted from its state at every step drawing what it drew left alone. Returns its choices."""
    data = data or training_set()
    choices, figures = play_curriculum(name, options, data, steps, ahead=ahead)
    for step, drawn in enumerate(choices):
        assert all(isinstance(i, int) and 0 <= i < len(data.samples) for i in drawn), \
            f"step {step + 1}: {name} chose {drawn}, not positions in the {len(data.samples)} samples"
    for step, row in enumerate(figures):
        bad: dict[str, str] = {}  # as the run checks them (toolrl.data.draws)
        finite_figures(row, f"step {step + 1}: curriculum", bad)
        assert not bad, "; ".join(bad.values())
    for restart in range(1, steps + ahead):
        again, _ = play_curriculum(name, options, data, steps, ahead=ahead, restart=restart)
        assert again == choices, f"{name}: resumed from its state at step {restart + 1}, it drew {again} " \
                                 f"where it drew {choices} left alone"
    return choices
