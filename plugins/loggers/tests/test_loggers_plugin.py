"""The loggers through real training runs (``toolrl train examples/tiny.yaml``), each read back with
the library's own reader: TensorBoard's EventAccumulator, the offline wandb run file, MlflowClient."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from wandb_records import history

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "examples" / "tiny.yaml"


def train(out: Path, *overrides: str, resume: bool = False, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "MLFLOW_ALLOW_FILE_STORE": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    args = [sys.executable, "-m", "toolrl", "train", str(TINY), f"trainer.output_dir={out}",
            "trainer.progress=false", "trainer.plot=false", *overrides, *(["--resume"] if resume else [])]
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)


def jsonl(out: Path) -> dict[int, dict]:
    return {row["step"]: row for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def tensorboard_scalars(out: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def wandb_rows(out: Path) -> list[dict]:
    files = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert files, f"no offline wandb run in {out / 'wandb'}"
    return [row for f in files for row in history(f)]


def mlflow_client(out: Path):
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    return MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())


def test_every_logger_records_the_run_and_resume_continues_it(tmp_path):
    out = tmp_path / "run"
    done = train(out, "trainer.total_steps=2", "trainer.save_every=1", "trainer.keep_checkpoints=3",
                 "trainer.loggers=[jsonl, tensorboard, wandb, mlflow]")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warning: logger" not in done.stderr
    rows = jsonl(out)
    assert sorted(rows) == [1, 2]

    tb = tensorboard_scalars(out)
    for key in ("reward_mean", "tool_call_rate", "loss", "grad_norm"):
        assert tb[key] == [(s, pytest.approx(rows[s][key], rel=1e-6)) for s in (1, 2)], key
    # Nested dicts are flattened with "/" and strings are left out.
    assert any(tag.startswith("terminations/") for tag in tb)
    assert "step" not in tb

    wb = wandb_rows(out)
    assert [r["_step"] for r in wb] == [1, 2]
    assert [r["reward_mean"] for r in wb] == [pytest.approx(rows[s]["reward_mean"]) for s in (1, 2)]
    run_id = (out / "wandb" / "toolrl-run-id").read_text()

    client = mlflow_client(out)
    mlflow_run = json.loads((out / "mlflow-run.json").read_text())["run_id"]
    history_ = client.get_metric_history(mlflow_run, "reward_mean")
    assert [(m.step, m.value) for m in history_] == [(s, pytest.approx(rows[s]["reward_mean"])) for s in (1, 2)]
    assert client.get_run(mlflow_run).info.status == "FINISHED"

    # A crash after step 2 was logged but before its checkpoint: --resume restarts from step 1.
    shutil.rmtree(out / "checkpoints" / "step_000002")
    done = train(out, "trainer.total_steps=3", "trainer.save_every=1", "trainer.keep_checkpoints=3",
                 "trainer.loggers=[tensorboard, wandb, mlflow]", resume=True)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = jsonl(out)
    assert sorted(rows) == [1, 2, 3]
    # TensorBoard purges the step logged before the crash: each step once, with the resumed run's value.
    assert tensorboard_scalars(out)["reward_mean"] == [(s, pytest.approx(rows[s]["reward_mean"], rel=1e-6))
                                                        for s in (1, 2, 3)]
    assert (out / "wandb" / "toolrl-run-id").read_text() == run_id  # the same wandb run goes on
    assert [r["_step"] for r in wandb_rows(out)][-2:] == [2, 3]
    assert json.loads((out / "mlflow-run.json").read_text())["run_id"] == mlflow_run
    steps = [m.step for m in client.get_metric_history(mlflow_run, "reward_mean")]
    assert sorted(set(steps)) == [1, 2, 3]  # MLflow keeps the replaced step 2 too: it cannot delete points


BROKEN = """
from toolrl import hookimpl
from toolrl.loggers import Logger

class Broken(Logger):
    name = "broken"
    def log(self, row, step):
        raise OSError("disk on fire")

@hookimpl
def register_loggers(register):
    register(Broken)
"""


def test_a_failing_logger_is_reported_once_and_the_run_completes(tmp_path):
    (tmp_path / "broken_logger.py").write_text(textwrap.dedent(BROKEN))
    info = tmp_path / "toolrl_plugin_broken-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toolrl-plugin-broken\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[toolrl]\nbroken = broken_logger\n")
    out = tmp_path / "run"
    done = train(out, "trainer.total_steps=2", "trainer.loggers=[broken, tensorboard]", path=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if "warning: logger" in line]
    assert warnings == ["warning: logger 'broken' failed to log and is disabled for the rest of the run: "
                        "OSError: disk on fire"]
    assert sorted(jsonl(out)) == [1, 2]
    assert [s for s, _ in tensorboard_scalars(out)["reward_mean"]] == [1, 2]  # the others go on


def test_listing_the_plugin_imports_none_of_the_logger_libraries():
    out = subprocess.run([sys.executable, "-m", "toolrl", "list-plugins", "--json"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    row = {r["name"]: r for r in json.loads(out.stdout)}["loggers"]
    assert row["status"] == "ok" and row["parts"] == {"loggers": ["tensorboard", "wandb", "mlflow"]}
    imported = {line.split("|")[-1].strip().split(".")[0] for line in out.stderr.splitlines() if "|" in line}
    assert not imported & {"torch", "tensorboard", "wandb", "mlflow", "pydantic"}
