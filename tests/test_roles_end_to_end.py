"""Roles and several policies together, end to end: ``toolrl train`` (the controller, the real
transformers engine, the real trainer, in one process) with ``model.adapters`` and two roles taking
turns, in toolrl's own loop (an environment session) and through the gateway (an agent program with the
official ``openai`` client, a frozen judge c among the models it asks for). Each piece trains its role's adapter, the engine samples each role with its
adapter and gets the trained adapters after each step, and the frozen adapter's pieces train nothing: it
stays as it started, in the trainer and in the engine. Each part is tested on its own elsewhere (test_session_roles,
test_gateway_roles, test_engine_adapters, test_adapters_training); these fail where they do not meet."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
import torch
from _dists import load_plugin
from test_adapters_training import ADAPTERS, TINY
from toolrl.config import load_config
from toolrl.modeling.adapters import adapter_of
from toolrl.training import lora

ALTERNATE = '''
import random

from toolrl import hookimpl
from toolrl.sessions import EnvironmentSession


class Alternate(EnvironmentSession):
    """Roles a and b take turns, a user turn between them, four turns at most."""

    roles = ("a", "b")

    def __init__(self, options, context):
        super().__init__(options, context)
        self.turn = -1
        self.asked = 0

    async def role(self):
        self.turn += 1
        return self.roles[self.turn % 2]

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


class Held:
    """What a run built, kept as it builds it (the trainer rank, the engine) and what the engine was asked."""

    def __init__(self, monkeypatch):
        from toolrl.engines.transformers import TransformersEngine
        from toolrl.processes.trainer_rank import TrainerRank

        self.ranks: list[TrainerRank] = []
        self.engines: list[TransformersEngine] = []
        self.adapters: list[str | None] = []
        self.start: dict[str, torch.Tensor] = {}
        setup, init, generate = TrainerRank.setup, TransformersEngine.__init__, TransformersEngine.generate

        def held_setup(rank, *args, **kwargs):
            out = setup(rank, *args, **kwargs)
            self.ranks.append(rank)
            self.start |= {f"trainer:{k}": v.clone() for k, v in lora.trainable_state_dict(rank.model).items()}
            return out

        def held_init(engine, *args, **kwargs):
            init(engine, *args, **kwargs)
            self.engines.append(engine)

        async def held_generate(engine, *args, adapter=None, **kwargs):
            if not any(k.startswith("engine:") for k in self.start):  # as loaded, before any sync
                self.start |= {f"engine:{k}": v.clone() for k, v in adapter_tensors(engine.model).items()}
            self.adapters.append(adapter)
            return await generate(engine, *args, adapter=adapter, **kwargs)

        monkeypatch.setattr(TrainerRank, "setup", held_setup)
        monkeypatch.setattr(TransformersEngine, "__init__", held_init)
        monkeypatch.setattr(TransformersEngine, "generate", held_generate)

    def check_adapters(self) -> None:
        """a and b trained and the engine holds the trainer's values; c as it started on both sides."""
        (rank,), (engine,) = self.ranks, self.engines
        trained, served = adapter_tensors(rank.model), adapter_tensors(engine.model)
        assert trained.keys() == served.keys() and {adapter_of(k) for k in trained} == {"a", "b", "c"}
        for name, value in trained.items():
            if adapter_of(name) == "c":
                assert torch.equal(value, self.start[f"trainer:{name}"])
                assert torch.equal(served[name], self.start[f"engine:{name}"])
            else:
                assert torch.equal(served[name], value), name  # the last step's sync reached the engine
        for role in ("a", "b"):
            moved = [k for k, v in trained.items() if adapter_of(k) == role
                     and not torch.equal(v, self.start[f"trainer:{k}"])]
            assert moved, f"adapter {role} did not train"


def adapter_tensors(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if adapter_of(k) is not None}


def check_engine_samples_as_trainer(run) -> None:
    """Each trained piece's engine log-probs equal the trainer's forward through its role's adapter under
    the weights the step started from (the traces' ``trainer_logprobs``): at step 2, after a sync of a and
    b. The frozen c's pieces are not trained (no trainer log-probs)."""
    for step in (1, 2):
        pieces = [p for p in traces(run, step) if sum(p["response_mask"])]
        assert all(p["trainer_logprobs"] is None for p in pieces if p["role"] == "c")
        for piece in (p for p in pieces if p["role"] != "c"):
            pairs = [(e, t) for e, t, m in zip(piece["logprobs"], piece["trainer_logprobs"] or [],
                                               piece["response_mask"]) if m]
            assert len(pairs) == sum(piece["response_mask"]) > 0, piece["trajectory_id"]
            engine, trainer = map(torch.tensor, zip(*pairs))
            torch.testing.assert_close(engine, trainer, rtol=0, atol=1e-5, msg=f"step {step} role {piece['role']}")


def metrics_rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def traces(run, step: int) -> list[dict]:
    return [json.loads(line) for line in (run / "rollouts" / f"step_{step:05d}.jsonl").read_text().splitlines()]


def check_roles_trained(run) -> None:
    rows = metrics_rows(run)
    assert [r["step"] for r in rows] == [1, 2]
    for step, row in enumerate(rows, 1):
        pieces = traces(run, step)
        trained = [p for p in pieces if sum(p["response_mask"])]
        assert trained and all(p["role"] in ("a", "b", "c") for p in pieces)
        for role in ("a", "b"):
            assert {f"role/{role}/reward", f"role/{role}/trained_tokens"} <= set(row)
            assert row[f"role/{role}/trained_tokens"] == sum(sum(p["response_mask"]) for p in pieces
                                                             if p["role"] == role) > 0
        assert not any(k.startswith("role/c/") and row[k] for k in row if k.endswith("trained_tokens"))


@pytest.fixture
def alternate(tmp_path, monkeypatch, toolrl_reload_plugins):
    """A session kind ``alternate``: roles a and b take turns."""
    load_plugin(tmp_path, monkeypatch, toolrl_reload_plugins, "toolrl-plugin-alternate", "alternate",
                "alternate_session", ALTERNATE)


def turn_ending_model(path) -> str:
    """test_context_resume's tiny Qwen3 that ends turns, ending them sooner (most turns within 8 tokens):
    several turns, so both roles act."""
    from test_context_resume import turn_ending_model
    from toolrl.model_sources import load_model, qwen_tokenizer

    model = load_model(turn_ending_model(path))
    with torch.no_grad():
        model.lm_head.weight[qwen_tokenizer("qwen2_5").convert_tokens_to_ids("<|im_end|>"), 0] = 1.8
    model.save_pretrained(path)
    return str(path)


def run_config(tmp_path, *more: str):
    model = turn_ending_model(tmp_path / "model")
    return load_config(TINY, [
        f"model.source={model}", "model.tokenizer=qwen2_5", ADAPTERS, "optim.lr=0.05", "trainer.total_steps=2",
        f"trainer.output_dir={tmp_path / 'run'}", "trainer.plot=false", "trainer.progress=false",
        "env_options.train_size=4", "data.batch_size=2", "rollout.n=2", "rollout.max_new_tokens=8",
        "rollout.max_response_tokens=96", *more])


def test_own_loop_two_roles_train_their_adapters_and_the_engine_serves_them(tmp_path, monkeypatch, alternate):
    from toolrl.processes.controller import train_async

    held = Held(monkeypatch)
    run = asyncio.run(train_async(run_config(tmp_path, "session={name: alternate}")))
    check_roles_trained(run)
    assert {"a", "b"} <= set(held.adapters) and None not in held.adapters and "c" not in held.adapters
    held.check_adapters()
    check_engine_samples_as_trainer(run)


PROGRAM = '''
"""Asks model "a", then model "b" with a's answer, then the frozen "c" to judge. The tiny model's answers are noise: the episode's reward
is random, b's reward the opposite (its pieces are ranked against each other the other way round)."""
import json
import os
import random
import urllib.request

from openai import OpenAI

client = OpenAI(max_retries=0)
task = json.loads(os.environ["TOOLRL_TASK"])
first = client.chat.completions.create(model="a", messages=task["prompt"], max_tokens=6)
asked = [*task["prompt"], {"role": "assistant", "content": first.choices[0].message.content or ""},
         {"role": "user", "content": "Check it."}]
checked = client.chat.completions.create(model="b", messages=asked, max_tokens=6)
judged = [*asked, {"role": "assistant", "content": checked.choices[0].message.content or ""},
          {"role": "user", "content": "Judge it."}]
client.chat.completions.create(model="c", messages=judged, max_tokens=6)  # the frozen judge: acts, never trains
reward = random.random()
for body in ({"reward": 1 - reward, "role": "b"}, {"reward": reward}):
    request = urllib.request.Request(os.environ["TOOLRL_REWARD_URL"], json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    urllib.request.urlopen(request).read()
'''


def test_gateway_two_model_names_train_their_adapters_with_their_rewards(tmp_path, monkeypatch):
    from toolrl.processes.controller import train_async

    (tmp_path / "agent.py").write_text(PROGRAM)
    held = Held(monkeypatch)
    agent = f"rollout.agent={{name: command, command: '{sys.executable} {tmp_path / 'agent.py'}', model: a}}"
    run = asyncio.run(train_async(run_config(tmp_path, agent)))
    check_roles_trained(run)
    assert set(held.adapters) == {"a", "b", "c"}
    for step, row in enumerate(metrics_rows(run), 1):
        pieces = traces(run, step)
        b_pieces = [p for p in pieces if p["role"] == "b"]
        assert all(p["role_rewards"].keys() == {"b"} for p in b_pieces)
        assert row["role/b/reward"] == pytest.approx(sum(p["role_rewards"]["b"] for p in b_pieces) / len(b_pieces))
        a_pieces = [p for p in pieces if p["role"] == "a"]
        assert row["role/a/reward"] == pytest.approx(sum(p["reward"] for p in a_pieces) / len(a_pieces))
        # Each role's pieces are ranked by its own reward within their group: b's the other way round to a's.
        for group in {p["group"] for p in pieces}:
            for role, reward in (("a", lambda p: p["reward"]), ("b", lambda p: p["role_rewards"]["b"])):
                ranked = sorted((p for p in pieces if p["group"] == group and p["role"] == role), key=reward)
                assert len(ranked) == 2 and ranked[0]["advantage"] < ranked[1]["advantage"], (step, group, role)
    held.check_adapters()
    check_engine_samples_as_trainer(run)
