"""TensorBoard event files in ``<run>/tensorboard`` (``tensorboard --logdir <run>/tensorboard``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolrl.config import Config
from toolrl.loggers import Logger, scalars


class TensorBoardLogger(Logger):
    name = "tensorboard"

    def open(self, run_dir: Path, config: Config, start_step: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: TensorBoard drops events at or after this step from earlier event files, so a
        # resumed run replaces the steps logged after its checkpoint, and a fresh run in a used
        # directory replaces the old run (step 1 onwards) instead of mixing with it.
        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start_step + 1)

    def log(self, row: Mapping[str, Any], step: int) -> None:
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
