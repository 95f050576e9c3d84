"""MLflow: by default a local file store in ``<run>/mlruns`` (``mlflow ui --backend-store-uri
<run>/mlruns``); ``MLFLOW_TRACKING_URI`` points elsewhere (a server, a database) and
``MLFLOW_EXPERIMENT_NAME`` names the experiment (default ``toolrl``). The run id is kept in
``<run>/mlflow-run.json`` so that ``--resume`` continues the same MLflow run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolrl.config import Config
from toolrl.loggers import Logger, scalars


class MlflowLogger(Logger):
    name = "mlflow"

    def open(self, run_dir: Path, config: Config, start_step: int = 0) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            # MLflow 3 asks for this opt-in to use the file store; its database store needs SQLAlchemy,
            # which mlflow-skinny does not bring.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        state_file = run_dir / "mlflow-run.json"
        saved = json.loads(state_file.read_text()) if start_step > 0 and state_file.exists() else {}
        if saved.get("tracking_uri") == uri:
            self.run_id = saved["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "toolrl")
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment_id, run_name=run_dir.resolve().name).info.run_id
        state_file.write_text(json.dumps({"tracking_uri": uri, "run_id": self.run_id}))
        self.client.log_dict(self.run_id, config.model_dump(mode="json"), "config.json")

    def log(self, row: Mapping[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in scalars(row).items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
