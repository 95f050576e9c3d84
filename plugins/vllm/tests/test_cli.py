"""`toolrl train` with ``engine.name=vllm`` on CPU, as a user runs it.

Through ``python -m toolrl``: vLLM's spawned engine processes re-import the entry point's module,
which is what the spawn guard must survive (the console script's own guard is pip's). One two-step run
checks both what a rollout writes (step 1, sampled by the initial weights) and what training changes
(step 2, sampled by the weights after step 1); the `rollout` command shares the engine and the loop,
and runs with the transformers engine in the core tests.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from toolrl import model_sources
from vllm_support import reference_logprobs

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "examples" / "tiny.yaml"
# The random model never answers correctly; a reward that splits each group (about half the random
# responses contain an "x") gives GRPO non-zero advantages, so the first step really moves the weights.
SPLIT_REWARD = "reward.functions=[{name: format, options: {pattern: x}}]"


def run_cli(argv: list[str], cwd: Path, *paths: Path) -> subprocess.CompletedProcess[str]:
    """``paths``: put first on the run's PYTHONPATH (a plugin of the test's own)."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if paths:
        env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def model_token_logprobs(model, row: dict, temperature: float) -> tuple[list[float], list[float]]:
    """(engine, transformers) logprobs of a trace's model tokens (mask 1)."""
    want, _ = reference_logprobs(model, row["prompt_ids"], row["response_ids"], temperature)
    mask = row["response_mask"]
    return ([lp for lp, m in zip(row["logprobs"], mask) if m], [lp for lp, m in zip(want, mask) if m])


def mean_abs(pairs: list[tuple[list[float], list[float]]]) -> float:
    diffs = [abs(a - b) for got, want in pairs for a, b in zip(got, want)]
    return sum(diffs) / len(diffs)


def test_train_samples_each_step_from_the_weights_it_trained(tmp_path, hf_model):
    out = tmp_path / "run"
    run_cli([sys.executable, "-m", "toolrl", "train", str(TINY), "engine.name=vllm", "trainer.total_steps=2",
             f"trainer.output_dir={out}", "trainer.plot=false", "trainer.progress=false", SPLIT_REWARD], REPO)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and all(m["errors"] == 0 for m in metrics)
    assert metrics[0]["reward_std"] > 0 and metrics[0]["grad_norm"] > 0, "step 1 must change the weights"
    for m in metrics:  # engine logprobs vs the trainer's recomputation on the weights it sampled with
        print(f"step {m['step']}: lp_mismatch {m['lp_mismatch']:.3e}")
        assert m["lp_mismatch"] < 1e-4

    # Step 1's traces: one row per sample, the engine's logprob at every model token and 0 elsewhere,
    # and they are the sampling distribution's: a transformers forward on the initial weights agrees.
    rows = read_jsonl(out / "rollouts" / "step_00001.jsonl")
    assert len(rows) == 8  # batch_size 2 x n 4
    for row in rows:
        assert row["error"] is None
        assert len(row["logprobs"]) == len(row["response_ids"]) == len(row["response_mask"]) > 0
        for lp, m in zip(row["logprobs"], row["response_mask"]):
            assert (lp < 0 and math.isfinite(lp)) if m else lp == 0.0
    assert mean_abs([model_token_logprobs(hf_model, r, temperature=1.0) for r in rows]) < 1e-4

    # Step 2's rollouts were sampled by the weights after step 1 (checkpoint step_000001), not the
    # initial ones: teacher-forced logprobs agree with the former and clearly not with the latter.
    rows = read_jsonl(out / "rollouts" / "step_00002.jsonl")
    from toolrl.training.export import export

    updated = model_sources.load_model(export(out, tmp_path / "step1", step=1))  # the sharded checkpoint, as HF
    on_updated = mean_abs([model_token_logprobs(updated, r, 1.0) for r in rows])
    on_initial = mean_abs([model_token_logprobs(hf_model, r, 1.0) for r in rows])
    print(f"step-2 traces: |engine - updated| {on_updated:.3e}, |engine - initial| {on_initial:.3e}")
    assert on_updated < 1e-4
    assert on_initial > 20 * on_updated and on_initial > 1e-4


ALTERNATE = '''
import random

from toolrl import hookimpl
from toolrl.sessions import EnvironmentSession


class Alternate(EnvironmentSession):
    """Roles a and b take turns, a user turn between them, four turns at most."""

    def __init__(self, options, context):
        super().__init__(options, context)
        self.turn = -1
        self.asked = 0

    async def role(self):
        self.turn += 1
        return ("a", "b")[self.turn % 2]

    async def respond(self, message):
        self.asked += 1
        return "Your turn." if self.asked < 4 else None

    async def score(self, trajectory):
        # The tiny model's answers are noise, often alike: a random reward gives each group a gradient.
        return random.random()


@hookimpl
def register_environment_sessions(register):
    register(Alternate, name="alternate")
'''


def alternate_plugin(root: Path) -> Path:
    """A distribution with a ``toolrl`` entry point registering the session kind ``alternate`` (roles a
    and b take turns), in ``root``: on the run's PYTHONPATH, plugin discovery finds it as a pip-installed one."""
    root.mkdir()
    (root / "alternate_session.py").write_text(ALTERNATE)
    info = root / "toolrl_plugin_alternate-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toolrl-plugin-alternate\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[toolrl]\nalternate = alternate_session\n")
    return root


def turn_ending_model(path: Path) -> str:
    """The tiny random Qwen3 (Qwen2.5 tokenizer, untied head) with an end-of-turn row its embeddings lean
    to (most turns end within 8 tokens): several turns, so both roles act."""
    import torch

    model_sources.tiny_qwen3(path, tokenizer_variant="qwen2_5", tie_word_embeddings=False)
    model = model_sources.load_model(str(path))
    eos = model_sources.qwen_tokenizer("qwen2_5").convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] += 1.0
        model.lm_head.weight[eos, 0] = 1.8
    model.save_pretrained(path)
    return str(path)


@pytest.mark.slow
def test_train_two_roles_trains_their_adapters_and_the_engine_samples_them(tmp_path):
    """model.adapters under the vllm engine: each role's pieces sample through its own vLLM LoRA adapter and
    train it, and after step 1's sync the engine's log-probs are the trainer's through each role's adapter."""
    out = tmp_path / "run"
    model = turn_ending_model(tmp_path / "model")
    adapters = ("model.adapters={a: {r: 4, target_modules: [q_proj, v_proj]}, "
                "b: {r: 8, alpha: 16, target_modules: [q_proj, v_proj, down_proj], lr: 0.02}}")
    run_cli([sys.executable, "-m", "toolrl", "train", str(TINY), "engine.name=vllm", f"model.source={model}",
             "model.tokenizer=qwen2_5", adapters, "session={name: alternate}", "optim.lr=0.01",
             "trainer.total_steps=2", f"trainer.output_dir={out}", "trainer.plot=false", "trainer.progress=false",
             "env_options.train_size=4", "rollout.n=2", "rollout.max_new_tokens=8", "rollout.max_response_tokens=96"],
            REPO, alternate_plugin(tmp_path / "plugin"))
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and all(m["errors"] == 0 for m in metrics)
    assert metrics[0]["grad_norm"] > 0, "step 1 must change the adapters"
    base = model_sources.load_model(model)  # the adapters as initialised (B = 0) serve the base model
    for step, row in enumerate(metrics, 1):
        pieces = [p for p in read_jsonl(out / "rollouts" / f"step_{step:05d}.jsonl") if sum(p["response_mask"])]
        assert pieces and all(p["role"] in ("a", "b") for p in pieces)
        for role in ("a", "b"):
            assert row[f"role/{role}/trained_tokens"] == sum(sum(p["response_mask"]) for p in pieces
                                                             if p["role"] == role) > 0
            assert f"role/{role}/reward" in row
            # Each piece's engine log-probs are the trainer's through its role's adapter (the traces'
            # trainer_logprobs, on the weights the step started from) ...
            pairs = [pair for p in pieces if p["role"] == role
                     for pair in zip(p["logprobs"], p["trainer_logprobs"], p["response_mask"]) if pair[2]]
            worst = max(abs(engine - trainer) for engine, trainer, _ in pairs)
            print(f"step {step} role {role}: |engine - trainer| up to {worst:.2e}")
            assert worst < 1e-4
            # ... and at step 2 those are the adapters step 1 trained, not the initial ones: the sync reached
            # the engine's adapter of each role.
            if step == 2:
                on_base = mean_abs([model_token_logprobs(base, p, 1.0) for p in pieces if p["role"] == role])
                print(f"step 2 role {role}: |engine - initial adapter| {on_base:.2e}")
                assert on_base > 1e-3


def test_plugin_registers_lazily():
    """Loading the plugin (every toolrl command does) imports neither vLLM nor torch."""
    code = ("import json, sys; from toolrl.plugins import get_plugins; get_plugins(); "
            "print(json.dumps(sorted(m for m in ('vllm', 'torch') if m in sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
    listed = subprocess.run([sys.executable, "-m", "toolrl", "list-plugins", "--json"], capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    (info,) = [p for p in json.loads(listed.stdout) if p["name"] == "vllm"]
    assert (info["status"], info["parts"]) == ("ok", {"rollout_engines": ["vllm"]})


def test_a_source_holding_only_a_tokenizer_is_refused_before_vllm_starts(tmp_path):
    """vLLM loads the model from model.source: a directory without one is one line at the run check
    (VLLMEngine.check_run), not an error out of vLLM's start."""
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    for file in Path(model_sources.tiny_qwen3()).iterdir():
        if file.name.startswith("tokenizer") or file.name == "chat_template.jinja":
            (folder / file.name).write_bytes(file.read_bytes())
    proc = subprocess.run([sys.executable, "-m", "toolrl", "eval", str(TINY), "engine.name=vllm",
                           f"model.source={folder}", "--output", str(tmp_path / "eval")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: override model.source=") and line.endswith(
        f": model.source: the vllm engine loads the model from {folder}, and there is no {folder / 'config.json'}")
    assert not (tmp_path / "eval").exists()
