"""Metric loggers (``register_loggers``, ``trainer.loggers``): where each step's metrics row goes besides
``metrics.jsonl``, fanned out by one :class:`MetricLoggers`. ``jsonl`` is always on: ``--resume``, the reward
plot and failed-step records read it, so a failure to write it fails the step. Any other logger that raises
is reported once on stderr and disabled; the run goes on without it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from toolrl.config import field_where, one_line
from toolrl.plugins.parts import BuildContext, build_part, describe_exception, registered_part
from toolrl.run_dir import RunDir

if TYPE_CHECKING:
    from toolrl.config import Config

JSONL = "jsonl"


class Logger:
    """A destination for per-step metrics (the contract: hookspecs' ``register_loggers``). On ``--resume``,
    rows of steps after ``start_step`` may have been logged before the crash and are logged again: a logger
    that can drop them (TensorBoard's ``purge_step``) should."""

    name: ClassVar[str] = ""

    def open(self, run_dir: Path, config: Config, start_step: int = 0) -> None:
        """Prepare to log the run in ``run_dir``."""

    def log(self, row: Mapping[str, Any], step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Flush and release what ``open`` acquired."""


def scalars(row: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a metrics row, nested dicts flattened with ``/`` (``tool_latency_s/calculator``);
    strings, lists and other non-numbers are left out, and so is the ``step`` key (the x axis)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(scalars(value, f"{name}/"))
        elif isinstance(value, int | float) and not (name == "step" and not prefix):
            out[name] = float(value)
    return out


class JsonlLogger(Logger):
    """``metrics.jsonl``: one JSON line per step, fsynced (what ``--resume`` reads)."""

    name = JSONL

    def open(self, run_dir: Path, config: Config, start_step: int = 0) -> None:
        self.run_dir = RunDir(run_dir)

    def log(self, row: Mapping[str, Any], step: int) -> None:
        self.run_dir.append_metrics(dict(row))


class MetricLoggers:
    """Every configured logger behind one ``log(row, step)``. Built by :func:`open_loggers`."""

    def __init__(self, loggers: Sequence[tuple[str, Logger]]) -> None:
        self._loggers = list(loggers)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self._loggers]

    def _disable(self, name: str, action: str, exc: BaseException) -> None:
        if name == JSONL:
            raise exc

        print(f"warning: logger {name!r} failed to {action} and is disabled for the rest of the run: "
              f"{one_line(describe_exception(exc))}", file=sys.stderr, flush=True)
        self._loggers = [(n, lg) for n, lg in self._loggers if n != name]

    def _each(self, action: str, call: Callable[[Logger], None]) -> None:
        for name, logger in list(self._loggers):
            try:
                call(logger)
            except Exception as exc:
                self._disable(name, action, exc)

    def log(self, row: Mapping[str, Any], step: int) -> None:
        self._each("log", lambda logger: logger.log(row, step))

    def close(self) -> None:
        self._each("close", lambda logger: logger.close())
        self._loggers = []


def logger_names(config: Config) -> list[str]:
    """``jsonl`` and every logger in ``trainer.loggers``, each checked to be registered (an unknown
    name is a :class:`~toolrl.config.ConfigError`); nothing is imported or opened."""
    names = [JSONL, *(n for n in dict.fromkeys(config.trainer.loggers) if n != JSONL)]
    for name in names:
        registered_part("loggers", name, field_where(config, "trainer.loggers"))
    return names


@contextmanager
def open_loggers(config: Config, run_dir: Path, start_step: int = 0) -> Iterator[MetricLoggers]:
    """Open ``jsonl`` and every logger in ``trainer.loggers``; closed on exit, also after an error.
    An unknown name is a :class:`~toolrl.config.ConfigError`; a logger that does not import or open
    is reported and left out."""
    fanout = MetricLoggers([])
    for name in logger_names(config):
        try:
            logger = build_part("loggers", name, {}, BuildContext("trainer.loggers", config=config))
            logger.open(run_dir, config, start_step)
        except Exception as exc:
            fanout._disable(name, "open", exc)
            continue
        fanout._loggers.append((name, logger))
    try:
        yield fanout
    finally:
        fanout.close()
