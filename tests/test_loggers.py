"""The metric-logger fan-out: ``jsonl`` always on, flattening, unknown names, failing loggers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from toolrl.config import ConfigError, load_config
from toolrl.loggers import JsonlLogger, Logger, MetricLoggers, open_loggers, scalars

ROOT = Path(__file__).resolve().parents[1]


def config(tmp_path, *overrides):
    return load_config(ROOT / "examples" / "tiny.yaml", [f"trainer.output_dir={tmp_path}", *overrides])


def test_scalars_flattens_nested_dicts_and_keeps_only_numbers():
    row = {"step": 3, "reward_mean": 0.5, "errors": 2, "failed": "boom", "nan": math.nan,
           "tool_latency_s": {"calculator": 0.01, "search": {"p50": 0.2}}, "terminations": {}, "ids": [1, 2]}
    out = scalars(row)
    assert out.keys() == {"reward_mean", "errors", "nan", "tool_latency_s/calculator", "tool_latency_s/search/p50"}
    assert out["errors"] == 2.0 and isinstance(out["errors"], float) and math.isnan(out["nan"])


class Recorder(Logger):
    name = "recorder"

    def __init__(self):
        self.rows = []

    def log(self, row, step):
        self.rows.append((step, dict(row)))


class Exploding(Logger):
    name = "exploding"

    def log(self, row, step):
        raise ConnectionError("server\ngone")


def test_a_failing_logger_is_reported_once_and_disabled(capsys):
    ok, bad = Recorder(), Exploding()
    loggers = MetricLoggers([("exploding", bad), ("recorder", ok)])
    for step in (1, 2, 3):
        loggers.log({"step": step, "reward_mean": step / 10}, step)
    assert [s for s, _ in ok.rows] == [1, 2, 3]
    assert loggers.names == ["recorder"]
    assert capsys.readouterr().err == ("warning: logger 'exploding' failed to log and is disabled for the rest "
                                       "of the run: ConnectionError: server gone\n")


def test_the_jsonl_logger_failing_fails_the_step(tmp_path):
    jsonl = JsonlLogger()
    jsonl.open(tmp_path / "missing-dir", config(tmp_path))
    loggers = MetricLoggers([("jsonl", jsonl)])
    with pytest.raises(FileNotFoundError):  # metrics.jsonl is the run's record (--resume reads it)
        loggers.log({"step": 1}, 1)


def test_jsonl_is_always_on_and_unknown_names_are_config_errors(tmp_path):
    with open_loggers(config(tmp_path, "trainer.loggers=[]"), tmp_path) as loggers:
        assert loggers.names == ["jsonl"]
        loggers.log({"step": 1, "reward_mean": 1.0}, 1)
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 1, "reward_mean": 1.0}
    with pytest.raises(ConfigError, match=r"trainer\.loggers: unknown logger 'nope' \(available: .*jsonl"), \
            open_loggers(config(tmp_path, "trainer.loggers=[jsonl, nope]"), tmp_path):
        pass
