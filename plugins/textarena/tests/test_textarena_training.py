"""Training on a TextArena game, end to end (`toolrl train`, the transformers engine, the trainer): one
seat a trained LoRA adapter, the other a frozen adapter that plays every game and stays bit for bit as
it started; and self-play, one policy in both seats, each seat's pieces trained on its own reward."""

from __future__ import annotations

import json

import torch
from click.testing import CliRunner
from toolrl.cli import cli

DIGITS = [str(d) for d in range(9)]


def move_making_model(path) -> str:
    """A tiny random Qwen3 (Qwen2.5 tokenizer, untied head) that answers with one cell number: a constant
    added to one embedding feature of every token, which the LM head's rows of the digits 0-8 read, and
    a second feature only the digits have, which the end of turn's row reads (and the digits' rows
    avoid): a digit, then the end of the turn. TextArena's action wrapper reads a bare "4" as "[4]", a
    legal move unless the cell is taken, so games differ and end in wins, losses and invalid moves."""
    from toolrl.model_sources import load_model, qwen_tokenizer, tiny_qwen3

    tiny_qwen3(path, tokenizer_variant="qwen2_5", tie_word_embeddings=False)
    model = load_model(str(path))
    tokenizer = qwen_tokenizer("qwen2_5")
    with torch.no_grad():
        digits, eos = tokenizer.convert_tokens_to_ids(DIGITS), tokenizer.convert_tokens_to_ids("<|im_end|>")
        model.model.embed_tokens.weight[:, 0] += 1.0
        model.model.embed_tokens.weight[digits, 1] += 1.0
        model.lm_head.weight[digits, 0], model.lm_head.weight[digits, 1] = 3.0, -6.0
        model.lm_head.weight[eos, 1] = 6.0
    model.save_pretrained(path)
    return str(path)


def train(tmp_path, *overrides: str):
    config = tmp_path / "game.yaml"
    config.write_text(f"""
model: {{source: {move_making_model(tmp_path / 'model')}, tokenizer: qwen2_5}}
env: textarena
env_options: {{game: TicTacToe-v0, train_size: 8, test_size: 2, max_turns: 12}}
data: {{batch_size: 1}}
engine: {{name: transformers}}
rollout: {{n: 4, temperature: 1.0, max_new_tokens: 2, max_response_tokens: 2048}}
algorithm: {{loss_agg: token-mean}}
optim: {{lr: 0.002, micro_batch_size: 8}}
trainer: {{total_steps: 2, save_every: 1, output_dir: {tmp_path / 'run'}, plot: false, progress: false}}
""")
    result = CliRunner().invoke(cli, ["train", str(config), *overrides])
    assert result.exit_code == 0, result.output[-3000:]
    return tmp_path / "run"


def traces(run, step):
    return [json.loads(line) for line in (run / "rollouts" / f"step_{step:05d}.jsonl").read_text().splitlines()]


def adapters(run, step) -> dict[str, torch.Tensor]:
    """The LoRA tensors of the step's checkpoint (torch's distributed checkpoint, read whole)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = run / f"step_{step}.pt"
    dcp_to_torch_save(run / "checkpoints" / f"step_{step:06d}", out)
    flat = {}

    def walk(tree, prefix=""):
        for key, value in tree.items():
            walk(value, f"{prefix}{key}.") if isinstance(value, dict) else flat.setdefault(prefix + key, value)

    walk(torch.load(out, weights_only=False))
    return {k: v for k, v in flat.items() if ".lora_" in k}


def test_a_frozen_opponent_plays_and_stays_bit_for_bit_as_it_started(tmp_path):
    run = train(tmp_path, "model.adapters={player_0: {r: 4}, player_1: {r: 4, frozen: true}}")
    for step in (1, 2):  # the frozen seat plays every step: its pieces are sampled with its adapter
        pieces = traces(run, step)
        assert {p["role"] for p in pieces} == {"player_0", "player_1"}
        assert all(p["trainer_logprobs"] is None for p in pieces if p["role"] == "player_1")
        assert all(set(p["role_rewards"]) == {"player_0", "player_1"} for p in pieces)
    first, second = adapters(run, 1), adapters(run, 2)
    frozen = [k for k in first if ".player_1." in k]
    trained = [k for k in first if ".player_0." in k]
    assert frozen and trained and first.keys() == second.keys()
    for key in frozen:  # as peft made it (lora_B zero) after both steps, bit for bit
        assert torch.equal(first[key], second[key]), key
        assert ".lora_B." not in key or not first[key].any()
    assert any(not torch.equal(first[k], second[k]) for k in trained)  # the other seat trained at step 2
