"""Processes the tests start: ranks of a gloo group (:func:`start_ranks`, on a free port :func:`spawn_ranks`), and a
training run killed mid-way, as a crash would (the one way the resume tests do it)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _dists import EVEN_TOKENS, load_plugin

# Measured, not computed: they differ from run to run (as in test_trainer's resume test).
TIMING = {"tokens_per_s", "tool_latency_s", "trainer_peak_mb", "weight_sync_peak_mb"}


# What a rank of these tests imports: a forked rank finds it imported (a spawned one imported it afresh, seconds of
# CPU each, most of a two-rank test's time on two cores).
PRELOAD = ["torch", "transformers", "transformers.models.qwen3.modeling_qwen3"]


def start_ranks(fn: Callable[..., None], args: tuple = (), nprocs: int = 2) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs)`` (``fn(rank, *args)`` in each; returns when all ended,
    raises if one failed), each rank forked from a server process that imported :data:`PRELOAD` once per test
    process, not a fresh interpreter. A rank gets this process's environment now and its torch thread count
    (``OMP_NUM_THREADS``), as a spawned rank would, not the server's from when it started."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)  # no effect once it runs
    mp.start_processes(_as_spawned, args=(dict(os.environ), fn, *args), nprocs=nprocs, start_method="forkserver")


def _as_spawned(rank: int, environ: dict[str, str], fn: Callable[..., None], *args: object) -> None:
    os.environ.clear()
    os.environ.update(environ)
    if environ.get("OMP_NUM_THREADS", "").isdigit():
        import torch

        torch.set_num_threads(int(environ["OMP_NUM_THREADS"]))
    fn(rank, *args)


def spawn_ranks(fn: Callable[..., None], nprocs: int, *args: object) -> None:
    """``fn(rank, port, *args)`` in ``nprocs`` ranks (:func:`start_ranks`), ``port`` a free loopback port for
    their process group; returns when all ended (raises if one failed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start_ranks(fn, (port, *args), nprocs)


def kill_after_checkpoint(args: list[str], env: dict[str, str], checkpoint: Path, timeout: float = 300) -> None:
    """Start ``args``, wait until ``checkpoint``'s ``meta.json`` exists (the checkpoint is complete),
    then SIGKILL the process: no handler runs, nothing is flushed or closed."""
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        while not (checkpoint / "meta.json").exists():
            assert proc.poll() is None, proc.stderr.read()[-2000:] if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()


def computed(rows: list[dict]) -> list[dict]:
    """Metrics rows without the measured figures."""
    return [{k: v for k, v in r.items() if not k.endswith("_s") and k not in TIMING} for r in rows]


def metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def toolrl_in_process(*args: str) -> None:
    """``toolrl <args>`` through click's runner in this process, torch on one thread as in the runs started as
    processes of their own (``OMP_NUM_THREADS=1``): the same command without another interpreter's start."""
    import torch
    from click.testing import CliRunner
    from toolrl.cli import cli

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = CliRunner().invoke(cli, list(args))
    finally:
        torch.set_num_threads(threads)
    assert res.exit_code == 0 and res.exception is None, (res.exception, res.output[-2000:])


def straight_and_resumed(args: Callable[[Path], list[str]], tmp_path: Path, steps: int, monkeypatch,
                         reload) -> tuple[list[dict], list[dict]]:
    """The computed metrics of ``toolrl <args(out)>`` left alone, and of the same run SIGKILLed after
    checkpoint 2 and resumed with ``--resume``. The runs see the ``even_tokens`` reward plugin: a random
    model's task rewards are all 0, and a reward that differs between samples gives every step a gradient.
    Only the killed run is a process of its own (its kill is a crash's); the run left alone and the resume
    run in this process, the plugin found by the same discovery (``reload``: the ``toolrl_reload_plugins``
    fixture's)."""
    load_plugin(tmp_path, monkeypatch, reload, "even-tokens", "even", "even_tokens_plugin", EVEN_TOKENS)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "plugin"), os.environ.get("PYTHONPATH")]))}
    toolrl_in_process(*args(tmp_path / "straight"))
    out = tmp_path / "killed"
    kill_after_checkpoint([sys.executable, "-m", "toolrl", *args(out)], env, out / "checkpoints" / "step_000002")
    assert len(metrics(out)) < steps  # it died mid-run
    toolrl_in_process(*args(out), "--resume")
    want = computed(metrics(tmp_path / "straight"))
    assert [r["step"] for r in want] == list(range(1, steps + 1))
    assert all(r["reward_std"] > 0 and r["grad_norm"] > 0 for r in want)  # every step had a gradient
    return want, computed(metrics(out))
