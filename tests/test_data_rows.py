"""A data row's ``prompt`` may be a plain string (verl's datasets have such rows): it is documented
behaviour, read as one user message, the same from parquet and from JSONL."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
from toolrl.data import load_files


def test_a_string_prompt_is_one_user_message_from_parquet_and_jsonl(tmp_path):
    rows = [{"prompt": "What is 2 + 2?", "reward_model": {"ground_truth": "4"}},
            {"prompt": "What is 3 + 3?", "reward_model": {"ground_truth": "6"}}]
    parquet, jsonl = tmp_path / "train.parquet", tmp_path / "train.jsonl"
    pq.write_table(pa.Table.from_pylist(rows), parquet)  # a parquet column of strings
    listed = {"prompt": [{"role": "user", "content": "What is 3 + 3?"}], "reward_model": {"ground_truth": "6"}}
    jsonl.write_text(json.dumps(rows[0]) + "\n" + json.dumps(listed) + "\n")  # JSONL rows may mix the two
    for path in (parquet, jsonl):
        first, second = load_files([path])
        assert [m.to_template() for m in first.prompt] == [{"role": "user", "content": "What is 2 + 2?"}]
        assert [m.to_template() for m in second.prompt] == [{"role": "user", "content": "What is 3 + 3?"}]
        assert (first.ground_truth, second.ground_truth) == ("4", "6")
