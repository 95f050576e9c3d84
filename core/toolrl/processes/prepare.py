"""What happens before step 1 of ``toolrl train``, top to bottom: :func:`prepare_training` is the
ordered list, each step one call into the module that owns it, with the reason it stands where it
does. Checks come first and cost least (nothing loaded, nothing written); every model loads after
every check; the run's directory is first written after the processes are up and the weights in place.
docs/architecture.md ("Before step 1") walks the same list."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolrl.algorithms.distill import opd_options
from toolrl.config import Config, ConfigError, field_where
from toolrl.data.batches import AHEAD, StepBatch
from toolrl.data.draws import Draws, open_draws
from toolrl.model_sources import model_skeleton
from toolrl.plugins import get_plugins
from toolrl.processes.replay import Replay
from toolrl.processes.resolve import ResolvedRun, resolve_run
from toolrl.processes.run_check import ModelInputs, check_model_inputs
from toolrl.processes.start import Processes, start_processes
from toolrl.processes.supervise import controller_restart
from toolrl.rollout.teacher import Conversation, Teachers, open_teachers
from toolrl.run_dir import HF_FILES, RunDir, checkpoint_shapes, open_mode, read_meta, restore_controller
from toolrl.training.export import save_model_files
from toolrl.trajectory import Trajectory


@dataclass
class Prepared:
    """A run ready for its first step. ``draws``: each group's prompt (the curriculum, where a resumed run
    left it); ``start``: steps trained already (a resumed run's checkpoint); ``position``: the groups
    consumed so far; ``ahead``: the next step's batch a ``one_step_off`` run generated before it stopped;
    ``recovered``: recoveries for the first metrics row (``--supervise``)."""

    run: ResolvedRun
    run_dir: RunDir
    processes: Processes
    draws: Draws
    start: int = 0
    position: int = 0
    ahead: StepBatch | None = None
    recovered: list[dict[str, Any]] = field(default_factory=list)
    teachers: Teachers | None = None  # on-policy distillation's (algorithm.teacher), built once


@dataclass
class Checked:
    """A run every check passed (:func:`check_training`), nothing loaded and nothing written."""

    run: ResolvedRun
    run_dir: RunDir
    inputs: ModelInputs
    draws: Draws
    ahead: StepBatch | None = None


async def prepare_training(config: Config, resume: bool = False, overwrite: bool = False) -> Prepared:
    """``config`` (loaded and validated: :func:`toolrl.config.load_config`, every bad field one line)
    made into a run at its first step."""
    checked = check_training(config, resume, overwrite)
    run = checked.run
    # On-policy distillation's teachers, built in this process as the run's engine is (toolrl.rollout.teacher),
    # each scoring a probe before the student's weights load: a teacher that cannot score ends the run here.
    teachers = await open_teachers(config, checked.inputs.tokenizer, field_where(config, "algorithm.teacher"),
                                   None if config.data.trajectories else sample_conversation(run),
                                   opd_options(config.algorithm).top_k) if config.algorithm.teachers else None
    processes: Processes | None = None
    try:
        # The processes placed, each building its parts where it runs (tools, the policy's weights, engines):
        # in this process, or as Ray actors.
        processes = await start_processes(run, inputs=checked.inputs)
        prepared = await _weights_and_first_write(run, checked.run_dir, processes, checked.draws, checked.ahead)
    except BaseException:
        if processes is not None:
            await processes.close()
        if teachers is not None:
            await teachers.close()
        raise
    prepared.teachers = teachers
    return prepared


def sample_conversation(run: ResolvedRun) -> Conversation:
    """A trajectory's prompt messages: those of the sample it was generated from, found by its environment
    and sample index (not by its group: the synchronous loop numbers a step's groups from 0, the stream
    numbers them through the data); none for a forked piece, whose prompt holds later turns, nor where
    two different prompts share an index."""
    by_sample: dict[tuple[str | None, int], list[dict[str, Any]] | None] = {}
    for sample in run.samples:
        key, messages = (sample.env, sample.index or 0), [m.to_template() for m in sample.prompt]
        by_sample[key] = messages if by_sample.get(key, messages) == messages else None

    def conversation(t: Trajectory) -> list[dict[str, Any]] | None:
        return None if t.piece else by_sample.get((t.env, t.sample_index))

    return conversation


def check_training(config: Config, resume: bool = False, overwrite: bool = False) -> Checked:
    """Every check of a training run, in the order a user would fix things; nothing loads a model and
    nothing is written, so any mistake is one line and costs seconds (``toolrl train --check`` stops here)."""
    get_plugins()  # a library caller's first look-up (the CLI loaded them to add their commands)
    run = resolve_run(config, "train")
    # The curriculum (data.curriculum) built on the training split: a bad option is one line here.
    draws = open_draws(run.config, run.samples, run.parts.envs)
    # The output directory: an earlier run there only with --resume or --overwrite. Opened, not written.
    run_dir = RunDir.open(config.trainer.output_dir, open_mode(resume, overwrite))
    ahead = None
    if run_dir.mode == "resume":
        # A damaged checkpoint, or one of another model, is one line before any weights load.
        check_resume(run_dir.latest_checkpoint(), run.model_dir)
        ahead = kept_batch(run_dir.latest_checkpoint())
        draws.restore(run_dir.latest_checkpoint())
    # The last checks, still before any model loads: tokenizer, family, prompts, every part's semantics.
    inputs = check_model_inputs(run.config, run.parts, run.model_dir, run.prompts)
    return Checked(run, run_dir, inputs, draws, ahead)


async def _weights_and_first_write(run: ResolvedRun, run_dir: RunDir, processes: Processes, draws: Draws,
                                   ahead: StepBatch | None) -> Prepared:
    config = run.config
    if config.data.trajectories:  # recorded groups are trained in place of generated ones
        processes.rollouts = Replay(processes.rollouts)
    # The engine can take weight updates (a frozen remote server cannot be trained).
    if (reason := await processes.rollouts.check_trainable()) is not None:
        raise ConfigError(f"engine.name: {reason}")
    prepared = Prepared(run, run_dir, processes, draws, ahead=ahead)
    if run_dir.mode == "resume":  # before the first write: a checkpoint that does not load changes nothing
        prepared.start, prepared.position = await restore_checkpoint(processes, run_dir)
    # Step 1 may begin: the run's first write (config.json), then what a resumed run drops and the
    # records every step adds to.
    run_dir.start(config)
    lost = run_dir.truncate_metrics(prepared.start)  # resumed: lines of steps after the checkpoint go
    # Recoveries not yet in a metrics row: this controller, when it replaces one that died (--supervise).
    prepared.recovered = controller_restart(prepared.start, lost)
    for row in prepared.recovered:
        run_dir.append_recovery({"step": prepared.start + 1, **row})
    run_dir.write_placement(processes.placement)
    save_model_files(processes.model_dir, run_dir.checkpoints / HF_FILES)
    return prepared


def check_resume(checkpoint: Path, model_dir: str) -> None:
    """Before the model loads: the checkpoint's files whole (:func:`toolrl.run_dir.checkpoint_shapes`)
    and its model tensors the shapes of this run's model (built on the meta device: no weights read),
    so that a damaged checkpoint, or one of another model, is one line with nothing loaded."""
    saved = checkpoint_shapes(checkpoint)
    for name, tensor in model_skeleton(model_dir).state_dict().items():
        if name in saved and tuple(tensor.shape) != saved[name]:
            raise ConfigError(f"--resume: {checkpoint}: the trainer's state cannot be loaded into this model: "
                              f"{name} is {list(saved[name])} in the checkpoint, {list(tensor.shape)} in "
                              f"{model_dir}")


def kept_batch(checkpoint: Path) -> StepBatch | None:
    """The next step's batch a ``one_step_off`` run kept in its checkpoint (None without one): read
    before the model loads, so a damaged file is one line with nothing loaded."""
    kept = checkpoint / AHEAD
    return StepBatch.load(kept) if kept.exists() else None


async def restore_checkpoint(processes: Processes, run_dir: RunDir) -> tuple[int, int]:
    """Load the latest checkpoint into the trainer (any world size wrote it) and the engines; the
    step and the data position."""
    ckpt = run_dir.latest_checkpoint()
    meta = read_meta(ckpt)
    await processes.training.load(str(ckpt))
    restore_controller(ckpt)
    step = int(meta["step"])
    await processes.sync_weights(step)
    return step, int(meta.get("data_position", step * processes.config.data.batch_size))
