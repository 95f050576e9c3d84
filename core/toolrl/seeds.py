"""Every seed a run derives, in one place, each a pure function of its root and a position, so a resumed
run, an asynchronous run and a recorded replay regenerate any trajectory with the seeds it had. Two roots:
``rollout.seed`` (what is sampled) and ``trainer.seed`` (the data order, a curriculum's draws, a mixture's
interleaving, and torch, numpy and ``random`` in every process). An engine's own ``seed`` option seeds
only requests sent without one (:func:`unseeded`): a rollout always sends one.

A trajectory's seed is linear in its step, group and sample, so that :func:`group_seed` (the stream numbers
groups globally) lands on the synchronous loop's seeds. Its turns, branches and continuations are a 63-bit
hash of its seed, the kind and the index (:func:`_child`): a stride there met other trajectories' seeds
(``seed + 7919·t`` gave 68,796 turn seeds twice over a 1,000-step run of 32 groups of 16 with 32 turns;
tests/test_seeds.py checks a realistic run). Turn 0 and continuation 0 keep their parent's seed.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

STEP = 7_777  # a synchronous step's batch: rollout.seed + STEP * step
GROUP = 1_000_003  # group g of a batch: the batch's seed + GROUP * g
SAMPLE = 10_007  # sample k of a group: the group's seed + SAMPLE * k
EPOCH = 999_983  # the data order of epoch e: shuffled with trainer.seed * EPOCH + e (a multiplier, not a stride)
STREAM = 1_000_003  # sample i of one seeded engine request of n: its seed * STREAM + i (odd: a bijection mod 2**63)
MASK = 0x7FFF_FFFF_FFFF_FFFF  # the 63 bits a torch generator (and vLLM's) takes as a non-negative seed


def _child(parent: int, kind: str, index: int) -> int:
    """The seed of descendant ``index`` of kind ``kind`` (turn, branch, fork: a split's continuation,
    the name it had, kept so its seeds stay) of ``parent``: 63 bits of BLAKE2b, the same everywhere."""
    digest = hashlib.blake2b(f"{kind}:{parent}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & MASK


def step_seed(rollout_seed: int, step: int) -> int:
    """The ``seed`` a synchronous step (0-based) runs its batch with (group ``j`` of the batch)."""
    return rollout_seed + STEP * step


def trajectory_seed(seed: int, group: int, k: int) -> int:
    """The seed of trajectory ``k`` of group ``group`` of a rollout call made with ``seed``: the one
    formula every rollout path uses (the loop, streamed groups, recorded groups, resumed runs)."""
    return seed + GROUP * group + SAMPLE * k


def group_seed(rollout_seed: int, group: int, batch_size: int) -> int:
    """The ``seed`` for ``run_group`` of global group ``group``: ``trajectory_seed(seed, group, k)``
    is then the seed the synchronous loop gives trajectory ``k`` of group ``group % batch_size`` in
    step ``group // batch_size``, so both modes sample the same trajectories from the same weights."""
    step = group // batch_size
    return step_seed(rollout_seed, step) - GROUP * batch_size * step


def turn_seed(trajectory: int, turn: int) -> int:
    """The engine's sampling seed for turn ``turn`` (0-based) of a trajectory seeded ``trajectory``."""
    return _child(trajectory, "turn", turn) if turn else trajectory


def branch_seed(trajectory: int, branch: int) -> int:
    """The seed of branch ``branch`` (1-based) of a trajectory seeded ``trajectory``."""
    return _child(trajectory, "branch", branch)


def continuation_seed(line: int, turn: int, continuation: int) -> int:
    """The seed of continuation ``continuation`` of a tree rollout's split before turn ``turn`` of the line
    seeded ``line``: 0 keeps the line's (a tree's first leaf is the flat trajectory of its seed), the others
    differ from it, each other and those of another turn's split (``width`` ≤ 64). Leaf ``k`` made up for a
    line that ended before its splits is continuation ``k`` of a split at turn 0."""
    return _child(line, "fork", 64 * turn + continuation) if continuation else line


def epoch_seed(data_seed: int, epoch: int) -> int:
    """The seed that shuffles the data of epoch ``epoch`` (``data_seed``: ``trainer.seed``)."""
    return data_seed * EPOCH + epoch


def draw_seed(data_seed: int, group: int) -> int:
    """The seed of a curriculum's random draws for group ``group`` (``data_seed``: ``trainer.seed``):
    the same for the group in a resumed run, whatever was drawn before it."""
    return _child(data_seed, "draw", group)


def sample_seed(request_seed: int, index: int) -> int:
    """The seed of sample ``index`` of an engine request for ``n`` samples seeded ``request_seed``: distinct,
    reproducible streams, within the 63 bits a generator takes."""
    return (request_seed * STREAM + index) & MASK


def unseeded(engine_seed: int | None) -> Iterator[int]:
    """The seeds an engine gives requests sent without one, in order: 62-bit draws from a stream seeded
    with its ``seed`` option (``None``: from the OS)."""
    rng = random.Random(engine_seed)
    while True:
        yield rng.getrandbits(62)
