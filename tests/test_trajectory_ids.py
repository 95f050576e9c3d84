"""Trajectory ids (toolrl.trajectory): what each maker writes, and that reading an id gives back
the parts it was made of; a saved row's old ``branch_point`` read as ``split_point``."""

from __future__ import annotations

import pytest
from toolrl.trajectory import (
    Trajectory,
    call_prefix,
    line_id,
    made_up_id,
    moved_id,
    part_id,
    prefixed_id,
    read_id,
    root_id,
)


def test_every_made_id_reads_back_as_the_parts_it_was_made_of():
    root = root_id(call_prefix("t", 3), 7, 1, 2)
    line = line_id(root, (0, 1))
    made = {
        root: ("t3-s7-g1-2", (), ""),
        line: ("t3-s7-g1-2", ("0", "1"), ""),
        made_up_id(line, 2): ("t3-s7-g1-2", ("0", "1", "r2"), ""),
        part_id(line, "piece", 4): ("t3-s7-g1-2", ("0", "1"), "~4"),
        part_id(made_up_id(root, 1), "branch", 12): ("t3-s7-g1-2", ("r1",), "~branch12"),
        part_id(root, "segment", 0): ("t3-s7-g1-2", (), "#0"),
        prefixed_id("e2-", part_id(root, "piece", 1)): ("e2-t3-s7-g1-2", (), "~1"),
    }
    assert list(made) == ["t3-s7-g1-2", "t3-s7-g1-2.0.1", "t3-s7-g1-2.0.1.r2", "t3-s7-g1-2.0.1~4",
                          "t3-s7-g1-2.r1~branch12", "t3-s7-g1-2#0", "e2-t3-s7-g1-2~1"]
    for tid, (root_, path, part) in made.items():
        assert read_id(tid) == (root_, path, part)
        assert root_ + "".join(f".{s}" for s in path) + part == tid
    assert line_id(line, (1, 0, 2)) == "t3-s7-g1-2.1.0.2"  # a line's key names its tree's other lines


def test_a_piece_moved_to_a_tree_line_keeps_its_part():
    assert moved_id("s0-g0-0.1~3", "s0-g0-0.1.0.2") == "s0-g0-0.1.0.2~3"
    assert moved_id("s0-g0-0~branch1", "s0-g0-0.1") == "s0-g0-0.1~branch1"
    assert moved_id("s0-g0-0", "s0-g0-0.1") == "s0-g0-0.1"


@pytest.mark.parametrize("text", ["", "s0.x", "s0~", "s0~1~2", "s0#1.2", "s0.r"])
def test_a_string_that_is_no_id_is_refused(text):
    with pytest.raises(ValueError, match="not a trajectory id"):
        read_id(text)


def test_a_row_saved_with_branch_point_reads_it_as_split_point():
    row = {"trajectory_id": "s0-g0-0.1", "sample_index": 0, "group": 0, "prompt_ids": [1], "tree_id": 0}
    assert Trajectory.model_validate({**row, "branch_point": 7}).split_point == 7
    assert Trajectory.model_validate({**row, "split_point": 7}).model_dump()["split_point"] == 7
