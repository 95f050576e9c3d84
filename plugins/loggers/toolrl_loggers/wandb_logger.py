"""Weights & Biases, offline by default: ``<run>/wandb/offline-run-*`` (``wandb sync`` uploads it).

``WANDB_MODE`` (``online`` to log to the server), ``WANDB_PROJECT`` (default ``toolrl``) and the
other ``WANDB_*`` variables are wandb's own. The run id is kept in ``<run>/wandb/toolrl-run-id`` so
that ``--resume`` continues the same wandb run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolrl.config import Config
from toolrl.loggers import Logger, scalars


class WandbLogger(Logger):
    name = "wandb"

    def open(self, run_dir: Path, config: Config, start_step: int = 0) -> None:
        import wandb

        id_file = run_dir / "wandb" / "toolrl-run-id"
        run_id = id_file.read_text().strip() if start_step > 0 and id_file.exists() else None
        id_file.parent.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "toolrl"), name=run_dir.resolve().name, id=run_id,
            resume="allow" if run_id else None, dir=str(run_dir),
            mode=os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]
            config=config.model_dump(mode="json"),
            # Console capture would wrap this process's stdout; the run's output is toolrl's own.
            settings=wandb.Settings(console="off"),
        )
        id_file.write_text(self.run.id)

    def log(self, row: Mapping[str, Any], step: int) -> None:
        self.run.log(scalars(row), step=step)

    def close(self) -> None:
        self.run.finish()
