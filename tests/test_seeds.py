"""The seeds a run derives (toolrl.seeds): no two positions of a realistic run share one."""

from __future__ import annotations

import itertools

from toolrl.seeds import (
    MASK,
    branch_seed,
    continuation_seed,
    epoch_seed,
    group_seed,
    sample_seed,
    step_seed,
    trajectory_seed,
    turn_seed,
    unseeded,
)


def run_trajectory_seeds(rollout_seed: int, steps: int, groups: int, n: int) -> list[int]:
    return [trajectory_seed(step_seed(rollout_seed, s), g, k)
            for s, g, k in itertools.product(range(steps), range(groups), range(n))]


def test_trajectory_seeds_are_distinct_over_a_long_run():
    # 1,000 steps of 64 groups of 16: 1M trajectories.
    seeds = run_trajectory_seeds(12345, 1000, 64, 16)
    assert len(set(seeds)) == len(seeds)


def test_turn_branch_and_continuation_seeds_collide_with_nothing_in_a_run():
    # 200 steps of 16 groups of 8, 16 turns each; every trajectory folds twice (8 turns a branch) and
    # splits as a width-2 depth-2 tree would: 0.5M seeds, the generator seeds the engine is handed.
    trajectories = run_trajectory_seeds(7, 200, 16, 8)
    seen: set[int] = set(trajectories)
    count = len(seen)
    for traj in trajectories:
        lines = [traj] + [continuation_seed(traj, 1, 1), continuation_seed(traj, 2, 1), continuation_seed(continuation_seed(traj, 1, 1), 2, 1)]
        for line in lines:
            seen.update(turn_seed(line, t) for t in range(1, 16))
            count += 15
        for b in (1, 2):
            branch = branch_seed(traj, b)
            seen.update(turn_seed(branch, t) for t in range(8))
            count += 8
        seen.update(lines[1:])
        count += 3
    assert len(seen) == count
    assert all(0 <= s <= MASK for s in seen)


def test_where_a_turn_stride_collided_the_seeds_differ():
    # What the hash replaced: a stride (7919) under linear trajectory seeds. Over 1,000 steps of 32 groups
    # of 16 with 32 turns it gave 68,796 seeds twice (the figure toolrl.seeds quotes), the first of them
    # turn 29 of step 0's group 2 sample 15 and turn 0 of step 306's first trajectory.
    a, b = trajectory_seed(step_seed(0, 0), 2, 15), trajectory_seed(step_seed(0, 306), 0, 0)
    assert a + 7_919 * 29 == b
    assert turn_seed(a, 29) != turn_seed(b, 0)


def test_first_turn_and_first_continuation_keep_their_parent():
    assert turn_seed(99, 0) == 99 and continuation_seed(99, 3, 0) == 99
    assert turn_seed(99, 1) != 99 and branch_seed(99, 1) != turn_seed(99, 1) != continuation_seed(99, 0, 1)


def test_seeds_are_pinned():
    # Recorded runs and replays regenerate trajectories from these values: they must not drift with the
    # platform or Python (BLAKE2b, little-endian, 63 bits).
    assert turn_seed(0, 1) == 6_322_354_456_362_444_837
    assert branch_seed(1_000, 2) == 3_149_316_324_457_563_147
    assert continuation_seed(5, 1, 1) == 8_513_042_129_239_005_610


def test_async_groups_land_on_the_synchronous_seeds():
    rollout_seed, batch = 3, 4
    for g in range(40):
        step, j = divmod(g, batch)
        for k in range(3):
            assert trajectory_seed(group_seed(rollout_seed, g, batch), g, k) == \
                trajectory_seed(step_seed(rollout_seed, step), j, k)


def test_engine_streams_and_epochs():
    # sample i of one request; one request's samples apart from another's (STREAM is odd: a bijection).
    requests = [turn_seed(trajectory_seed(0, 0, k), t) for k in range(64) for t in range(8)]
    streams = [sample_seed(r, i) for r in requests for i in range(4)]
    assert len(set(streams)) == len(streams)
    assert len({epoch_seed(11, e) for e in range(1000)}) == 1000
    a, b = unseeded(5), unseeded(5)
    assert [next(a) for _ in range(3)] == [next(b) for _ in range(3)]
