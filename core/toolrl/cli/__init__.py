"""The ``toolrl`` command line. Imports stay light here: ``list-plugins`` must not pull in torch,
transformers, ray or vllm, so every heavy import sits inside the command that needs it."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import click

from toolrl.cli.env import env as env_group
from toolrl.cli.errors import UsageFailure, error_text, json_option, mapping_option, user_errors
from toolrl.plugins import PluginLoadError, get_plugins


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="toolrl")
def cli() -> None:
    """Reinforcement learning for LLMs that call tools."""


@cli.command("list-plugins")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--check", is_flag=True, help="Also import and check every registered part (slower).")
def list_plugins(as_json: bool, check: bool) -> None:
    """List installed plugins: distribution, version, hooks, parts and load status."""
    plugins = get_plugins()
    if check:
        plugins.check()
        from toolrl.families import registered_families

        registered_families()  # a family naming a parser no plugin registers marks its plugin too
    infos = [i.as_dict() for i in plugins.list()]
    if as_json:
        click.echo(json.dumps(infos, indent=2))
        return
    rows = [(i["name"], "builtin" if i["builtin"] else i["distribution"], i["version"], i["status"],
             "; ".join(f"{k}: {', '.join(v)}" for k, v in i["parts"].items()) or "-") for i in infos]
    # Each column as wide as its longest entry: a long distribution name shifts the columns, not one row.
    widths = [max((len(r[c]) for r in rows), default=0) for c in range(4)]
    for row, info in zip(rows, infos, strict=True):
        click.echo(" ".join(f"{cell:<{w}}" for cell, w in zip(row[:4], widths, strict=True)) + f" {row[4]}")
        if info["error"]:
            click.echo(f"{'':<{widths[0]}} error: {info['error']}")


# -- tools ----------------------------------------------------------------------------------------


@cli.group()
def tool() -> None:
    """List tools and call them by hand."""


async def _load_tools(tools_config: str | None, name: str, config: dict[str, Any]) -> dict[str, Any]:
    from toolrl.tools.verl_config import build_default_tool, build_tools, load_tools_file

    if tools_config:
        if config:
            raise UsageFailure("--config applies to a tool built without --tools-config")
        return await build_tools(load_tools_file(tools_config))
    built = await build_default_tool(name, config)
    return {built.name: built}


async def _close(tools: dict[str, Any]) -> None:
    for t in tools.values():
        await t.close()


@tool.command("list")
@click.option("--tools-config", type=click.Path(exists=True, dir_okay=False), help="verl-format tools YAML.")
@click.option("--json", "as_json", is_flag=True, help="Print the OpenAI tool schemas as JSON.")
def tool_list(tools_config: str | None, as_json: bool) -> None:
    """List tools: from a tools config, or every registered tool."""
    rows: list[dict[str, Any]] = []
    if tools_config:
        import asyncio

        from toolrl.tools.verl_config import build_tools, load_tools_file

        async def build() -> None:
            tools = await build_tools(load_tools_file(tools_config))
            try:
                rows.extend({"name": n, "schema": t.tool_schema.model_dump()} for n, t in tools.items())
            finally:
                await _close(tools)

        user_errors(asyncio.run, build())
    else:
        from toolrl.config import ConfigError
        from toolrl.plugins.parts import lookup_part, registered_parts

        for part in registered_parts("tools"):
            try:
                schema = getattr(lookup_part("tools", part.name, "tool"), "schema", None)
            except ConfigError as exc:  # a broken part is listed, not fatal
                schema = {"error": str(exc).removeprefix("tool: ")}
            rows.append({"name": part.name, "plugin": part.plugin, "schema": schema})
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    for row in rows:
        fn = (row["schema"] or {}).get("function", {}) if isinstance(row["schema"], dict) else {}
        desc = fn.get("description", "(schema comes from its config)" if row["schema"] is None else "")
        plugin = f"[{row['plugin']}] " if "plugin" in row else ""
        click.echo(f"{row['name']:<24} {plugin}{desc.splitlines()[0] if desc else ''}")


@tool.command("call")
@click.argument("name")
@click.argument("arguments")
@click.option("--tools-config", type=click.Path(exists=True, dir_okay=False), help="verl-format tools YAML.")
@click.option("--config", "config_json", help="The tool's config mapping, as JSON.")
@click.option("--create-kwargs", "create_json", help="create() kwargs, as JSON (e.g. ground_truth).")
@click.option("--json", "as_json", is_flag=True, help='Print {"text", "step_reward", "reward", "metrics", "status", "error"}.')
def tool_call(name: str, arguments: str, tools_config: str | None, config_json: str | None,
              create_json: str | None, as_json: bool) -> None:
    """Run one whole lifecycle of tool NAME (create, execute, calc_reward, release) on ARGUMENTS."""
    import asyncio

    args = json_option(arguments, "ARGUMENTS")
    config = mapping_option(config_json, "--config")
    create_kwargs = mapping_option(create_json, "--create-kwargs")

    async def lifecycle() -> tuple[Any, Any]:
        from toolrl.schemas import ToolCall
        from toolrl.tools import ToolSet

        tools = await _load_tools(tools_config, name, config)
        try:
            if name not in tools:
                raise UsageFailure(f"no tool {name!r} in {tools_config} (has: {', '.join(sorted(tools))})")
            # The same lifecycle driver as rollouts: timeouts, checks of what the tool returns, and
            # calc_reward/release that always run.
            toolset = ToolSet({name: tools[name]}, {name: {"create_kwargs": create_kwargs}})
            await toolset.start()
            if name in toolset.create_errors:  # e.g. a missing ground_truth: the tool says what it needs
                raise UsageFailure(f"tool {name!r} create() failed: {toolset.create_errors[name]}")
            try:  # a non-object reaches the tool's argument check, as a model's would
                result = await toolset.call(ToolCall.model_construct(name=name, arguments=args))
            finally:
                rewards = await toolset.finish()
            return result, rewards.get(name), toolset.finish_errors.get(name)
        finally:
            await _close(tools)

    result, reward, finish_error = user_errors(asyncio.run, lifecycle())
    failed = result.status != "ok" or finish_error is not None
    if as_json:
        click.echo(json.dumps({"text": result.response.text, "step_reward": result.step_reward,
                               "reward": reward, "metrics": result.metrics, "status": result.status,
                               "error": finish_error}, default=str))
    else:
        click.echo(result.response.text, err=result.status != "ok")
        if finish_error is not None:
            click.echo(f"error: {finish_error}", err=True)
    if failed:
        sys.exit(1)


# -- parsing --------------------------------------------------------------------------------------


def _fail(message: str) -> NoReturn:
    """A failure of the parser rather than of the user's input: one line on stderr, exit 1."""
    click.echo(f"error: {' '.join(message.split())}", err=True)
    sys.exit(1)


def _parse_in_time(parser: Any, parser_name: str, text: str, seconds: float) -> Any:
    """``parser.parse(text)`` under the time limit a rollout gives it (toolrl.parsers.parse_on_thread): a
    parser that raises or returns no ParseResult is one error line; one still running after ``seconds``
    ends the process (a thread cannot be stopped) with one."""
    from concurrent.futures import TimeoutError as Late

    from toolrl.parsers import parse_on_thread
    from toolrl.schemas import ParseResult

    future = parse_on_thread(parser, text)
    try:
        result = future.result(seconds)
    except Late:
        click.echo(f"error: parser {parser_name!r} did not finish within {seconds:g} s (--timeout)", err=True)
        sys.stderr.flush()
        os._exit(1)
    except BaseException as exc:  # whatever a plugin raises is reported, never shown as a traceback
        _fail(f"parser {parser_name!r} failed: {type(exc).__name__}: {exc}")
    if not isinstance(result, ParseResult):
        _fail(f"parser {parser_name!r} returned {type(result).__name__}, not a ParseResult")
    return result


@cli.command("parse")
@click.option("--parser", "parser_name", default="hermes", show_default=True, help="Registered parser name.")
@click.option("--options", "options_json", help="Parser options, a JSON object (the tags parser's routes).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Seconds the parser may take; past them the command stops with an error.")
@click.argument("source", default="-")
def parse_command(parser_name: str, options_json: str | None, timeout: float, source: str) -> None:
    """Parse a model output (FILE or - for stdin, UTF-8) into content, calls and errors, as JSON."""
    import gc

    from toolrl.config import ConfigError, decode_utf8, read_text
    from toolrl.plugins.parts import BuildContext, build_part

    options = mapping_option(options_json, "--options")
    try:
        parser = build_part("tool_parsers", parser_name, options, BuildContext("--parser", "--options"))
        text = decode_utf8(sys.stdin.buffer.read(), "<stdin>") if source == "-" else read_text(Path(source))
    except ConfigError as exc:
        raise UsageFailure(error_text(exc)) from None
    gc.freeze()  # the imported modules stay out of the collections that 10^5 result objects set off
    fields = _parse_in_time(parser, parser_name, text, timeout).model_dump(exclude={"calls": {"__all__": {"id"}}})
    # One line per field: json.dumps with indent runs the pure-Python encoder (0.6 s for 10^5 calls).
    try:  # NaN or Infinity would print as non-JSON: only a broken parser plugin returns them
        lines = [f"{json.dumps(key)}: {json.dumps(value, allow_nan=False)}" for key, value in fields.items()]
    except ValueError as exc:
        _fail(f"parser {parser_name!r} returned a value that is not JSON: {exc}")
    click.echo("{" + ",\n ".join(lines) + "}")


# -- training -------------------------------------------------------------------------------------


def _load_config(path: str, overrides: tuple[str, ...]) -> Any:
    from toolrl.config import load_config

    return user_errors(load_config, path, list(overrides))


def _tools_origin(config_path: str, config: Any) -> str:
    """Where tools come from (a tools file, the config's ``tools.entries``), for tool-config errors."""
    from toolrl.config import resolve_path

    origins = []
    if config.tools.config_path:
        origins.append(str(resolve_path(config, config.tools.config_path)))
    if config.tools.entries:
        origins.append(f"{config_path}: tools.entries")
    return " or ".join(origins)


OVERWRITE_HELP = "Replace the run already in the output directory (its metrics, traces and checkpoints)."


@cli.command("train", context_settings={"ignore_unknown_options": True})
@click.argument("config_path", metavar="CONFIG.yaml")
@click.argument("overrides", nargs=-1)
@click.option("--resume", is_flag=True, help="Continue from the last checkpoint in trainer.output_dir.")
@click.option("--overwrite", is_flag=True, help=OVERWRITE_HELP)
@click.option("--supervise", is_flag=True, help="Run the controller as a child process and start it again "
              "(with --resume) whenever it dies; see docs/recovery.md.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=10, show_default=True,
              help="With --supervise: restarts of the controller before giving up.")
@click.option("--check", "check_only", is_flag=True, help="Run every check of the run (config, data, model files, "
              "tokenizer, template, each part's settings against the model) and stop: no weights load, nothing "
              "is written.")
def train_command(config_path: str, overrides: tuple[str, ...], resume: bool, overwrite: bool, supervise: bool,
          max_restarts: int, check_only: bool) -> None:
    """Train with the config's RL algorithm (algorithm.advantage: grpo, rloo, gigpo, ...; algorithm.loss).
    OVERRIDES are dotted.key=value pairs (e.g. trainer.total_steps=2). The whole run is checked before
    trainer.output_dir is written; a run already there is continued only with --resume, replaced only with --overwrite."""
    config = _load_config(config_path, overrides)
    if check_only:
        from toolrl.processes.prepare import check_training

        checked = user_errors(check_training, config, resume=resume, overwrite=overwrite,
                              tools_origin=_tools_origin(config_path, config))
        routes = len(checked.run.parts.routes)
        click.echo(f"check passed: {len(checked.run.samples)} samples, {routes} route{'s' * (routes != 1)}, model "
                   f"{checked.run.model_dir}; nothing loaded, nothing written")
        return
    if supervise:
        from toolrl.processes.supervise import supervise as run_supervised

        flags = [*(["--resume"] if resume else []), *(["--overwrite"] if overwrite else [])]
        sys.exit(run_supervised([config_path, *overrides, *flags], Path(config.trainer.output_dir), max_restarts))
    from toolrl.processes.controller import run_training
    from toolrl.processes.trainer_group import TrainerFailed

    try:
        with every_trajectory_failed_exits_1():
            user_errors(run_training, config, resume=resume, overwrite=overwrite,
                        tools_origin=_tools_origin(config_path, config))
    except TrainerFailed as exc:  # a dead rank: one line, then `--resume` continues from the checkpoint
        click.echo(f"error: {exc}; resume from the last checkpoint with --resume", err=True)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C: one line saying how to go on, no traceback
        click.echo(interrupted_line(config, ["toolrl", "train", config_path, *overrides]), err=True)
        sys.exit(130)


def interrupted_line(config: Any, argv: list[str]) -> str:
    """What an interrupted run says last: the command that continues it from its last checkpoint."""
    import shlex

    from toolrl.run_dir import RunDir, latest

    checkpoint = latest(RunDir(config.trainer.output_dir).checkpoints)
    if checkpoint is None:
        return f"interrupted before the first checkpoint: run again with --overwrite to start over ({shlex.join(argv)} --overwrite)"
    return f"interrupted: {shlex.join(argv)} --resume continues from {checkpoint.name}"


@cli.command("rollout", context_settings={"ignore_unknown_options": True})
@click.argument("config_path", metavar="CONFIG.yaml")
@click.argument("overrides", nargs=-1)
@click.option("--overwrite", is_flag=True, help=OVERWRITE_HELP)
def rollout_command(config_path: str, overrides: tuple[str, ...], overwrite: bool) -> None:
    """Run rollouts and rewards without training; same outputs as train."""
    config = _load_config(config_path, overrides)
    from toolrl.processes.controller import run_rollout

    with every_trajectory_failed_exits_1():
        user_errors(run_rollout, config, overwrite=overwrite, tools_origin=_tools_origin(config_path, config))


@contextlib.contextmanager
def every_trajectory_failed_exits_1() -> Iterator[None]:
    """The exit code of rollout, eval and train: 0 when the command ran, even with trajectories that
    ended in errors (recorded, and summarized on stderr: :class:`toolrl.run_dir.FailureTally`); 1,
    after one line, when every trajectory failed."""
    from toolrl.run_dir import EveryTrajectoryFailed  # lazy: run_dir imports pydantic, list-plugins must not

    try:
        yield
    except EveryTrajectoryFailed as exc:
        click.echo(f"error: {exc}: every trajectory failed", err=True)
        sys.exit(1)


@cli.command("eval", context_settings={"ignore_unknown_options": True})
@click.argument("config_path", metavar="CONFIG.yaml")
@click.argument("overrides", nargs=-1)
@click.option("--output", "output", type=click.Path(file_okay=False), help="Directory for results.jsonl and summary.json.")
@click.option("--overwrite", is_flag=True, help="Replace the evaluation already in --output.")
@click.option("--compare", "compare", type=click.Path(exists=True, file_okay=False),
              help="Print this eval directory's summary beside --output's (or the first argument's); runs nothing.")
def eval_command(config_path: str, overrides: tuple[str, ...], output: str | None, overwrite: bool,
             compare: str | None) -> None:
    """Evaluate on the held-out split: eval.num_samples problems, eval.n samples each at
    eval.temperature; writes OUTPUT/results.jsonl and OUTPUT/summary.json (an earlier evaluation
    there is replaced only with --overwrite). OVERRIDES are dotted.key=value pairs. With
    --compare DIR2, prints two evaluations instead: their summaries as A and B with B − A, and the
    problems only one of them solved."""
    from toolrl.processes import evaluate as ev

    if compare is not None:  # `toolrl eval DIR1 --compare DIR2` or `toolrl eval CONFIG --output DIR1 --compare DIR2`
        if overrides:
            raise UsageFailure("--compare reads two eval output directories and takes no overrides")
        user_errors(ev.print_comparison, Path(output or config_path), Path(compare))
        return
    if output is None:
        raise UsageFailure("--output DIR is required (where results.jsonl and summary.json go)")
    config = _load_config(config_path, overrides)
    with every_trajectory_failed_exits_1():
        summary = user_errors(ev.run_evaluation, config, Path(output), overwrite=overwrite,
                              tools_origin=_tools_origin(config_path, config))
    ev.print_table({output: summary})


@cli.command("export")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--step", type=int, default=None, help="Checkpoint step (default: the latest).")
def export_command(run_dir: str, out_dir: str, step: int | None) -> None:
    """Write a checkpoint of RUN_DIR as a Hugging Face model directory OUT_DIR (safetensors, config,
    tokenizer), loadable with from_pretrained and by the vLLM engine."""
    from toolrl.training.export import ExportError
    from toolrl.training.export import export as export_checkpoint

    try:
        written = export_checkpoint(Path(run_dir), Path(out_dir), step)
    except ExportError as exc:
        raise UsageFailure(str(exc)) from None
    click.echo(str(written))


cli.add_command(env_group)


def main() -> None:
    # torch's CPU allocations of 2 MB and more on huge pages here and in what a run starts: logits faulted in
    # 2 MB at a time, not 4 kB (docs/benchmarks.md, "CPU allocations"). Read at torch's first allocation.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    try:
        plugins = get_plugins()
    except PluginLoadError as exc:  # strict mode
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    plugins.add_commands(cli)
    cli(prog_name="toolrl")
