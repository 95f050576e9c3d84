"""A run whose trajectories have several segments (a context policy on), killed (SIGKILL) after its second
checkpoint while the next step's trajectories were in flight (``one_step_off`` generates step 3's batch
while step 2 trains; the checkpoint keeps it) and resumed with ``--resume``, gives the same metrics (less
timings) and the same trace rows, segments and their edits included, as the run left alone.

Bit-identical needs the engine to decode one row at a time (``engine.max_batch_size=1``): with rows
batched together, which rows share a forward depends on when each trajectory's next turn arrives, and
the engine's logprobs move in the last float bits with the batch (measured: a few segments' logprobs
differed by ~1e-8 between two runs that were never killed, so lp_mismatch, loss and grad_norm did too).

The tiny random model never ends a turn by itself (its end-of-turn token is one of 151k), so the test
builds one that does: a tiny random Qwen3 whose residual stream carries a constant feature that its
end-of-turn logit reads (about one turn in six ends at each token). A session that answers every answer
with a user turn keeps the conversation going, and ``window`` cuts it into segments at
``model.max_context``. Real model, engine, trainer, template, session and policy throughout."""

import json

import pytest
from _dists import make_dist
from _processes import straight_and_resumed
from test_trainer import TINY, lines
from toolrl.data.batches import StepBatch

STEPS = 4

FOLLOW_UP = """
from pydantic import BaseModel, ConfigDict
from toolrl import hookimpl
from toolrl.sessions import EnvironmentSession


class FollowUpOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    turns: int = 4


class FollowUp(EnvironmentSession):
    # Every answer gets a user turn asking for more, ``turns`` times: a conversation of several turns.
    Options = FollowUpOptions

    def __init__(self, options, context):
        super().__init__(options, context)
        self.asked = 0

    async def respond(self, message):
        self.asked += 1
        return None if self.asked > self.options.turns else f"Go on, part {self.asked} of {self.options.turns}."


@hookimpl
def register_environment_sessions(register):
    register(FollowUp, name="follow_up")
"""


def turn_ending_model(path) -> str:
    """A tiny random Qwen3 (Qwen2.5 tokenizer, untied head) that ends turns: a constant added to one
    embedding feature of every token, which the end-of-turn row of the LM head reads."""
    import torch
    from toolrl.model_sources import load_model, qwen_tokenizer, tiny_qwen3

    tiny_qwen3(path, tokenizer_variant="qwen2_5", tie_word_embeddings=False)
    model = load_model(str(path))
    eos = qwen_tokenizer("qwen2_5").convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] += 1.0
        model.lm_head.weight[eos, 0] = 1.4
    model.save_pretrained(path)
    return str(path)


def timeless(value):
    """A trace row without its measured seconds."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if not k.endswith("_s")}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


@pytest.mark.slow
@pytest.mark.long  # over two minutes on two cores; resuming a killed run is shown by test_async's and test_algorithm_resume's
def test_a_run_killed_with_segmented_trajectories_in_flight_resumes_bit_identical(tmp_path, monkeypatch,
                                                                                 toolrl_reload_plugins):
    plugin = tmp_path / "follow_up_plugin"
    plugin.mkdir()
    make_dist(plugin, "follow-up", "follow", "follow_up_plugin", FOLLOW_UP)
    monkeypatch.setenv("PYTHONPATH", str(plugin))  # the killed run's process
    monkeypatch.syspath_prepend(str(plugin))  # the runs in this process (found once straight_and_resumed reloads)
    model = turn_ending_model(tmp_path / "model")

    def args(out):
        return ["train", TINY, f"model.source={model}", "model.tokenizer=qwen2_5", "model.max_context=400",
                f"trainer.total_steps={STEPS}", f"trainer.output_dir={out}", "trainer.plot=false",
                "trainer.progress=false", "env_options.train_size=8", "rollout.n=2", "rollout.max_new_tokens=24",
                "rollout.max_response_tokens=200", "session={name: follow_up, options: {turns: 4}}",
                "rollout.context={name: window, keep_turns: 1, trigger_tokens: 320}",
                "reward.functions=[{name: even_tokens}]", "trainer.max_staleness=1",
                "trainer.async_schedule=one_step_off", "engine.max_batch_size=1"]

    want, got = straight_and_resumed(args, tmp_path, STEPS, monkeypatch, toolrl_reload_plugins)
    assert got == want
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    # The checkpoint holds the next step's batch, generated ahead: trajectories in several segments, each
    # with its edit (the one a killed run resumes from, step 2's, is pruned once the run goes on).
    ahead = StepBatch.load(straight / "checkpoints" / "step_000003" / "ahead.pt").generated
    assert any(t.edit is not None and t.edit.action == "window" for t in ahead)
    assert {t.trajectory_id for t in ahead} == {r["trajectory_id"] for r in lines(straight / "rollouts" / "step_00004.jsonl")}
    for step in range(1, STEPS + 1):
        name = f"step_{step:05d}.jsonl"
        rows = lines(straight / "rollouts" / name)
        assert [timeless(r) for r in lines(killed / "rollouts" / name)] == [timeless(r) for r in rows]
        edits = [r["edit"] for r in rows if r.get("edit")]
        assert edits and all(e["action"] == "window" for e in edits)  # trajectories in several segments
        keys = {r["trajectory_key"] or r["trajectory_id"] for r in rows}
        assert len(rows) > len(keys) and all(json.dumps(r["trainer_logprobs"]) != "null" for r in rows)
