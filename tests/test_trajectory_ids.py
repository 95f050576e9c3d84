"""Trajectory ids (toolrl.trajectory_ids): what each maker writes, and that reading an id gives back
the parts it was made of."""

from __future__ import annotations

import pytest
from toolrl.trajectory_ids import TrajectoryId, call_prefix, line_id, moved, part_id, prefixed, root_id


def test_every_made_id_reads_back_as_the_parts_it_was_made_of():
    root = root_id(call_prefix("t", 3), 7, 1, 2)
    line = line_id(root, (0, 1))
    made = {
        root: TrajectoryId("t3-s7-g1-2"),
        line: TrajectoryId("t3-s7-g1-2", ("0", "1")),
        line_id(line, (0, 1, "r2")): TrajectoryId("t3-s7-g1-2", ("0", "1", "r2")),
        part_id(line, "piece", 4): TrajectoryId("t3-s7-g1-2", ("0", "1"), "piece", 4),
        part_id(root, "branch", 12): TrajectoryId("t3-s7-g1-2", (), "branch", 12),
        part_id(root, "segment", 0): TrajectoryId("t3-s7-g1-2", (), "segment", 0),
        prefixed("e2-", part_id(root, "piece", 1)): TrajectoryId("e2-t3-s7-g1-2", (), "piece", 1),
    }
    assert list(made) == ["t3-s7-g1-2", "t3-s7-g1-2.0.1", "t3-s7-g1-2.0.1.r2", "t3-s7-g1-2.0.1~4",
                          "t3-s7-g1-2~branch12", "t3-s7-g1-2#0", "e2-t3-s7-g1-2~1"]
    for text, tid in made.items():
        assert TrajectoryId.parse(text) == tid
        assert str(tid) == text


def test_a_piece_moved_to_a_tree_line_keeps_its_part():
    assert moved("s0-g0-0.1~3", "s0-g0-0.1.0.2") == "s0-g0-0.1.0.2~3"
    assert moved("s0-g0-0~branch1", "s0-g0-0.1") == "s0-g0-0.1~branch1"


@pytest.mark.parametrize("text", ["", "s0.x", "s0~", "s0~1~2", "s0#1.2", "s0.r"])
def test_a_string_that_is_no_id_is_refused(text):
    with pytest.raises(ValueError, match="not a trajectory id"):
        TrajectoryId.parse(text)
