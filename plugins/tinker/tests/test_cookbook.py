"""tinker-cookbook's own code, unchanged, against ``toolrl tinker serve`` on loopback: the ``math_rl``
recipe on its arithmetic environment for a few steps, through the cookbook's ``rl/train.py`` loop
synchronously, asynchronously (``max_steps_off_policy``) and with streamed minibatches; the ``chat_sl``
recipe on a local chat file, and ``math_rl`` from its checkpoint, graded by scripts/tinker_additions.py
(scripts/tinker_demo.sh's two stages and its grader).

The cookbook runs in a virtual environment of its own, as a user of the hosted service has it
(tinker-cookbook 0.5.8, its own tinker and transformers): ``TOOLRL_COOKBOOK_PYTHON`` names its
interpreter (the plugin's nox session makes it). The model is the tiny random Qwen3 the server holds as
``tiny-qwen3``; the cookbook loads its tokenizer by that name from a Hugging Face cache laid out by
:func:`toolrl_tinker.hub_names.write_hub_cache`, offline.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

KEY = "tml-cookbook-test-key"
MODEL = "tiny-qwen3"
# A name in the cookbook's table of hosted models, which the server offers on the tiny model (its renderer
# there, qwen3_instruct, is the one the tiny model's Qwen3 tokenizer speaks).
HOSTED = "Qwen/Qwen3-4B-Instruct-2507"
COOKBOOK_PYTHON = os.environ.get("TOOLRL_COOKBOOK_PYTHON", "")
GRADER = Path(__file__).resolve().parents[3] / "scripts" / "tinker_additions.py"
pytestmark = pytest.mark.skipif(
    not COOKBOOK_PYTHON,
    reason="TOOLRL_COOKBOOK_PYTHON names no interpreter with tinker-cookbook==0.5.8 (nox -s 'plugin(tinker)' makes one)")


@contextlib.contextmanager
def serving(tmp: Path, *args: str) -> Iterator[str]:
    """``toolrl tinker serve`` as a user starts it (with ``args``), on a free port; yields its URL."""
    log = tmp / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "toolrl", "tinker", "serve", "--base", MODEL,
                                 "--base", f"{HOSTED}={MODEL}", "--port", "0",
                                 "--state-dir", str(tmp / "state"), "--api-key", KEY, *args],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"})
    try:
        deadline = time.time() + 240
        while not (found := re.search(r"tinker API on (http://\S+)", log.read_text())):
            assert proc.poll() is None and time.time() < deadline, f"the server did not start:\n{log.read_text()}"
            time.sleep(0.2)
        yield found.group(1)
    finally:
        # A gap stalls a client's queue 30 s (toolrl_tinker.futures.GAP_S): named in the run's warnings summary.
        for gap in re.findall(r".*never came.*", log.read_text()):
            warnings.warn(f"the cookbook's server: {gap}", stacklevel=1)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving(tmp_path_factory.mktemp("cookbook-server")) as url:
        yield url


@pytest.fixture(scope="module")
def server_two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server with its trainer on two ranks (a local Ray, gloo, the base sharded over them)."""
    with serving(tmp_path_factory.mktemp("cookbook-server-two"), "--world-size", "2") as url:
        yield url


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from toolrl_tinker.hub_names import write_hub_cache

    return write_hub_cache((MODEL, f"{HOSTED}={MODEL}"), tmp_path_factory.mktemp("hf-hub"))


def cookbook_env(hub_cache: Path) -> dict[str, str]:
    env = {**os.environ, "TINKER_API_KEY": KEY, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache),
           "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)  # the cookbook's venv sees nothing of toolrl's
    return env


def recipe(module: str, server: str, hub_cache: Path, log_path: Path, *args: str,
           model: tuple[str, ...] = (f"model_name={MODEL}", "renderer_name=qwen3_instruct")) -> list[dict]:
    """The cookbook's recipe ``module`` on the tiny model (LoRA rank 4; ``model``: the arguments that name
    it) with ``args``; its metrics rows once it finished."""
    result = subprocess.run(
        [COOKBOOK_PYTHON, "-m", f"tinker_cookbook.recipes.{module}.train", *model, f"base_url={server}",
         f"log_path={log_path}", "lora_rank=4",
         "eval_every=0", "save_every=0", "behavior_if_log_dir_exists=delete", *args],
        capture_output=True, text=True, env=cookbook_env(hub_cache), timeout=240, cwd=log_path.parent)
    assert result.returncode == 0 and "Training completed successfully" in result.stderr, result.stderr[-4000:]
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def math_rl(server: str, hub_cache: Path, log_path: Path, *args: str, **named: tuple[str, ...]) -> list[dict]:
    """The cookbook's math_rl recipe on its arithmetic environment, groups of 2."""
    return recipe("math_rl", server, hub_cache, log_path, "env=arithmetic", "group_size=2", *args, **named)


def final_checkpoint(log_path: Path) -> dict:
    records = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()]
    assert records[-1]["name"] == "final"
    return records[-1]


def check_on_policy(rows: list[dict], episodes: int) -> None:
    """Every step sampled ``episodes`` arithmetic episodes, and the log-probs the trainer computed for the
    sampled tokens are the sampler's (the cookbook's KL between them, per token)."""
    for row in rows:
        assert row["env/all/total_episodes"] == episodes
        assert abs(row["optim/kl_sample_train_v1"]) < 1e-4, row


def test_math_rl_arithmetic_runs_unchanged_under_a_hosted_name(server: str, hub_cache: Path, tmp_path: Path) -> None:
    """The recipe on its arithmetic environment for two steps, under a name of the cookbook's table of hosted
    models (``serve --base Qwen/Qwen3-4B-Instruct-2507=tiny-qwen3``) and no ``renderer_name``: it finds the
    renderer in that table and the tokenizer under the name (``toolrl tinker tokenizers NAME=SOURCE``). The
    other tests name the model as ``tiny-qwen3`` with its renderer."""
    rows = math_rl(server, hub_cache, tmp_path / "run", "groups_per_batch=2", "max_steps=2", model=(f"model_name={HOSTED}",))
    assert [row["progress/batch"] for row in rows] == [0, 1]
    check_on_policy(rows, episodes=4)
    assert final_checkpoint(tmp_path / "run")["sampler_path"].startswith("tinker://")


def test_async_off_policy(server: str, hub_cache: Path, tmp_path: Path) -> None:
    """rl/train.py's asynchronous loop: sampling and training run at once, samples at most one step stale.
    Two steps show it: step 1 trains on groups sampled while step 0 trained (a third batch's samples would
    be two steps stale by then, and the loop discards them)."""
    rows = math_rl(server, hub_cache, tmp_path / "run", "groups_per_batch=2", "max_steps=2", "max_steps_off_policy=1")
    assert [row["training_client/step"] for row in rows] == list(range(len(rows))) and len(rows) >= 2
    for row in rows:
        assert row["training_client/step"] - row["sampling_client/step_max"] <= 1
    check_on_policy(rows[:1], episodes=4)
    assert final_checkpoint(tmp_path / "run")["batch"] == 2


@pytest.mark.parametrize("ranks", ["server", "server_two"])
def test_stream_minibatch(ranks: str, hub_cache: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """rl/train.py's streamed minibatches: two forward_backward calls per step, each on the groups sampled
    so far, then one optim_step; the next step samples from the weights that step saved. Also against the
    server on two trainer ranks."""
    rows = math_rl(request.getfixturevalue(ranks), hub_cache, tmp_path / "run", "groups_per_batch=4", "max_steps=2",
                   "stream_minibatch_config.groups_per_batch=4", "stream_minibatch_config.num_minibatches=2")
    assert [row["progress/batch"] for row in rows] == [0, 1]
    assert [row["sampling_client/step_mean"] for row in rows] == [0.0, 1.0]
    check_on_policy(rows, episodes=8)


def test_chat_sl_on_a_local_file_then_math_rl_from_its_checkpoint(server: str, hub_cache: Path, tmp_path: Path) -> None:
    """scripts/tinker_demo.sh's two stages: chat_sl on a local chat JSONL, then math_rl with
    ``load_checkpoint_path`` at the SL run's final state. At learning rate 0 the RL run's final weights are
    the ones it loaded: they score a sequence as the SL checkpoint does, not as the base model. The demo's
    grader reads both runs' checkpoints: the RL run's curve from the SL checkpoint (step 0) through every
    sampler checkpoint it saved."""
    import tinker

    conversation = [{"role": "user", "content": "What is 4 + 5?"}, {"role": "assistant", "content": "9"}]
    data = tmp_path / "chats.jsonl"
    data.write_text("\n".join(json.dumps({"messages": conversation}) for _ in range(6)) + "\n")
    rows = recipe("chat_sl", server, hub_cache, tmp_path / "sl", f"dataset={data}", "batch_size=2",
                  "learning_rate=0.01", "num_epochs=1", "infrequent_eval_every=0")
    assert len(rows) == 3 and rows[-1]["train_mean_nll"] < rows[0]["train_mean_nll"]
    sl = final_checkpoint(tmp_path / "sl")
    math_rl(server, hub_cache, tmp_path / "rl", f"load_checkpoint_path={sl['state_path']}", "groups_per_batch=2",
            "max_steps=2", "save_every=1", "learning_rate=0")
    service = tinker.ServiceClient(base_url=server, api_key=KEY)
    tokens = tinker.ModelInput.from_ints(list(range(3, 40)))

    def scored(**where: str) -> list[float]:
        return service.create_sampling_client(**where).result().compute_logprobs(tokens).result()[1:]

    loaded, trained = scored(model_path=final_checkpoint(tmp_path / "rl")["sampler_path"]), scored(model_path=sl["sampler_path"])
    assert max(abs(a - b) for a, b in zip(loaded, trained)) < 1e-6
    assert max(abs(a - b) for a, b in zip(trained, scored(base_model=MODEL))) > 1e-3

    graded = subprocess.run(
        [COOKBOOK_PYTHON, str(GRADER), "held-out", "--base-url", server, "--model", MODEL, "--renderer", "qwen3_instruct",
         "--sl-log", str(tmp_path / "sl"), "--rl-log", str(tmp_path / "rl"), "--sl-examples", "6",
         "--groups-per-batch", "2", "--train-batches", "2", "--problems", "4", "--draws", "2"],
        capture_output=True, text=True, env=cookbook_env(hub_cache), timeout=240)
    assert graded.returncode == 0, graded.stderr[-4000:]
    *_, curve, last = graded.stdout.splitlines()
    assert re.findall(r"step (\d+) \d+ \(\d+\.\d\)", curve) == ["0", "1", "2"], curve
    assert re.fullmatch(r"held-out success, the RL run's start → end: greedy \d/4 → \d/4, "
                        r"temperature 1 \d\.\d/4 → \d\.\d/4", last), last
