"""On-policy distillation (toolrl.algorithms.distill, .align, toolrl.rollout.teacher): a teacher's log-probs of the
student's sampled tokens, the reverse-KL advantage, several teachers by route, a teacher of another
tokenizer, and the settings refused before any model loads."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from test_config_errors import invoke, one_error_line, write_config
from toolrl import model_sources
from toolrl.algorithms import CANDIDATE_LOGPROBS, build_estimator
from toolrl.algorithms.align import char_ends, pieces, spread
from toolrl.config import AlgorithmConfig, Config, OptimConfig
from toolrl.engines import ModelSource, SamplingParams
from toolrl.model_sources import load_model
from toolrl.rollout.teacher import Teacher, Teachers, open_teachers
from toolrl.training.step import StepOptions, token_advantages, train_step
from toolrl.trajectory import Trajectory

OPD = AlgorithmConfig(advantage="opd", teacher={"model": "tiny-qwen3"})


def teachers(tok, *configs: dict) -> Teachers:
    """The teachers ``configs`` built as a run builds them (each scores a probe first)."""
    config = Config(env="arithmetic", algorithm={"advantage": "opd", "teacher": list(configs)})
    return asyncio.run(open_teachers(config, tok, "algorithm.teacher"))


def teacher(tok, **config) -> Teacher:
    return teachers(tok, config).teachers[0]


def sampled_with_a_tool_result(path: str) -> tuple[list[Trajectory], object]:
    """Two trajectories from the transformers engine: a turn, a tool result (mask 0), a second turn."""
    from toolrl.engines.transformers import TransformersEngine

    tok = model_sources.load_tokenizer(path)
    engine = TransformersEngine.create(ModelSource(path), {"device": "cpu", "dtype": "float32"})
    tool = tok.encode("<tool_response>\n42\n</tool_response>\n")

    async def one(seed: int) -> Trajectory:
        prompt = tok.encode("What is 6 times 7? Use the tool.")
        first = (await engine.generate(prompt, SamplingParams(max_new_tokens=6, seed=seed)))[0]
        context = prompt + first.token_ids + tool
        second = (await engine.generate(context, SamplingParams(max_new_tokens=6, seed=seed + 7)))[0]
        response = first.token_ids + tool + second.token_ids
        mask = [1] * len(first.token_ids) + [0] * len(tool) + [1] * len(second.token_ids)
        return Trajectory(trajectory_id=f"t{seed}", sample_index=0, group=0, prompt_ids=prompt, response_ids=response,
                          response_mask=mask, logprobs=first.logprobs + [0.0] * len(tool) + second.logprobs,
                          reward=float(seed))

    async def both() -> list[Trajectory]:
        return [await one(1), await one(2)]

    return asyncio.run(both()), tok


@pytest.fixture(scope="module")
def sampled(tiny_qwen3_path):
    return sampled_with_a_tool_result(tiny_qwen3_path)


def test_the_teachers_logprobs_are_a_separate_forward_and_tool_results_get_none(tiny_qwen3_path, sampled):
    trajs, tok = copy.deepcopy(sampled[0]), sampled[1]
    asyncio.run(teacher(tok, model="tiny-qwen3").score(trajs))
    model = load_model(tiny_qwen3_path).eval()
    for t in trajs:
        ids = torch.tensor([t.prompt_ids + t.response_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(t.prompt_ids) - 1:-1]
        forward = torch.log_softmax(logits, -1).gather(-1, ids[0, len(t.prompt_ids):, None])[:, 0].tolist()
        assert 0 in t.response_mask and len(t.teacher_logprobs) == len(t.response_ids)
        for got, want, m in zip(t.teacher_logprobs, forward, t.response_mask, strict=True):
            assert (abs(got - want) < 1e-5) if m else got == 0.0


def test_the_students_own_weights_as_teacher_give_every_token_advantage_zero(sampled):
    """Teacher = the student: the reverse-KL advantage is 0 up to the engine's float rounding, and exactly
    0 at the tool result's tokens."""
    trajs, tok = copy.deepcopy(sampled[0]), sampled[1]
    asyncio.run(teacher(tok, model="tiny-qwen3").score(trajs))
    adv = token_advantages(trajs, build_estimator(OPD), 16, OPD)
    mask = torch.zeros_like(adv)
    for i, t in enumerate(trajs):
        mask[i, :len(t.response_mask)] = torch.tensor(t.response_mask, dtype=torch.float32)
    assert adv.abs().max() < 1e-5
    assert (adv[mask == 0] == 0).all()


@pytest.mark.parametrize("equal", [True, False])
def test_a_teacher_that_agrees_with_the_student_changes_nothing(tiny_qwen3_path, sampled, equal):
    """Teacher log-probs equal to the student's: every advantage is exactly 0 and an AdamW step leaves
    every weight as it was; a teacher that disagrees (control) moves them."""
    trajs = copy.deepcopy(sampled[0])
    for t in trajs:
        t.teacher_logprobs = [lp + (0.0 if equal else 0.5 * m) for lp, m in zip(t.logprobs, t.response_mask, strict=True)]
    model = load_model(tiny_qwen3_path)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    metrics = train_step(model, optimizer, trajs, StepOptions(OPD, OptimConfig(), pad_id=0, temperature=1.0,
                                                              max_response_tokens=32))
    moved = max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before, strict=True))
    if equal:
        assert moved == 0.0 and metrics["advantage_abs_mean"] == 0.0
    else:
        assert moved > 1e-4 and metrics["advantage_mean"] == pytest.approx(0.5, abs=1e-6)


def row(env: str | None, lps: list[float], teacher: list[float] | None, mask: list[int], reward: float, group: int):
    return Trajectory(trajectory_id=f"{env}{group}{reward}", sample_index=0, group=group, env=env, prompt_ids=[1],
                      response_ids=list(range(2, 2 + len(lps))), response_mask=mask, logprobs=lps,
                      teacher_logprobs=teacher, reward=reward)


def test_several_teachers_by_route_with_their_weights_and_the_task_reward():
    """A = w_T · (teacher − student) + λ · A_grpo on trained tokens; math's teacher weighs 2, tool's 0.5,
    and a route no teacher scores gets the reward's part only."""
    algo = AlgorithmConfig(advantage="opd", advantage_options={"reward_weight": 0.25},
                           teacher=[{"model": "tiny-qwen3", "routes": ["math"], "weight": 2.0},
                                    {"model": "tiny-qwen3", "routes": ["tool"], "weight": 0.5}])
    trajs = [row("math", [-1.0, -2.0], [-0.5, -3.0], [1, 1], 1.0, 0),
             row("math", [-1.0, -1.0], [-1.0, -1.0], [1, 1], 0.0, 0),
             row("tool", [-2.0, 0.0, -1.0], [-1.0, 0.0, -3.0], [1, 0, 1], 1.0, 1),
             row("tool", [-1.0, 0.0, -1.0], [-1.0, 0.0, -1.0], [1, 0, 1], 0.0, 1),
             row("other", [-1.0], None, [1], 1.0, 2), row("other", [-1.0], None, [1], 0.0, 2)]
    adv = token_advantages(trajs, build_estimator(algo), 8, algo)
    g = 1.0 / (2 ** 0.5 + 1e-6) * 0.25  # grpo of rewards (1, 0) in a group of two: ±1/std, std = √0.5
    expected = torch.tensor([[2 * 0.5 + g, 2 * -1.0 + g, 0.0], [-g, -g, 0.0],
                             [0.5 * 1.0 + g, 0.0, 0.5 * -2.0 + g], [-g, 0.0, -g], [g, 0.0, 0.0], [-g, 0.0, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_a_row_its_teacher_did_not_score_is_refused():
    trajs = [row(None, [-1.0], None, [1], 0.0, 0)]
    with pytest.raises(ValueError, match="no teacher log-probs"):
        token_advantages(trajs, build_estimator(OPD), 8, OPD)


def test_teachers_score_only_their_routes(tiny_qwen3_path, sampled):
    trajs, tok = copy.deepcopy(sampled[0]), sampled[1]
    trajs[0].env, trajs[1].env = "math", "other"
    asyncio.run(teachers(tok, {"model": "tiny-qwen3", "routes": ["math"]}).score(trajs))
    assert trajs[0].teacher_logprobs is not None and trajs[1].teacher_logprobs is None


# -- another tokenizer ------------------------------------------------------------------------------


def test_spread_gives_each_student_token_the_mass_of_the_characters_it_covers():
    # Text "abcdef": student tokens "ab" "cde" "f"; teacher tokens "abc" (-3) "def" (-6).
    assert spread([2, 5, 6], [(0, 3), (3, 6)], [-3.0, -6.0]) == pytest.approx([-2.0, -1.0 - 4.0, -2.0])
    assert pieces([0, 0, 1, 1, 0, 1]) == [pieces([0, 0])[0], *pieces([0, 0, 1, 1, 0, 1])[1:]]
    assert [(p.start, p.end, p.sampled) for p in pieces([0, 1, 1, 0, 1])] == [(0, 1, False), (1, 3, True),
                                                                            (3, 4, False), (4, 5, True)]


def test_char_ends_hold_a_multibyte_character_split_over_tokens(tiny_qwen3_path):
    tok = model_sources.load_tokenizer(tiny_qwen3_path)
    ids = tok.encode("snow ☃ man 🦜!")
    text, ends = char_ends(tok, ids)
    assert text == "snow ☃ man 🦜!" and ends[-1] == len(text) and ends == sorted(ends)


@pytest.fixture(scope="module")
def smollm2():
    from toolrl.model_sources import ModelUnavailable, smollm2_135m

    try:
        return smollm2_135m()
    except ModelUnavailable as exc:
        pytest.skip(str(exc))


def test_a_teacher_of_another_tokenizer_gives_each_piece_its_logprob_of_the_text(smollm2, tiny_qwen3_path):
    """Student: the Qwen tokenizer; teacher: SmolLM2 (another vocabulary). Over each sampled piece the
    student's tokens share exactly the teacher's log-prob of the piece's text; the tool result gets none."""
    student = model_sources.load_tokenizer(tiny_qwen3_path)
    prompt = student.encode("<|im_start|>user\nWhat is 6 times 7?<|im_end|>\n<|im_start|>assistant\n")
    first, tool, second = (student.encode(s) for s in ("I will call the calculator: 6*7 → ", "\nresult: 42\n",
                                                       "The answer is 42."))
    end = student.convert_tokens_to_ids("<|im_end|>")
    response = first + tool + second + [end]
    mask = [1] * len(first) + [0] * len(tool) + [1] * (len(second) + 1)
    t = Trajectory(trajectory_id="x", sample_index=0, group=0, prompt_ids=prompt, response_ids=response,
                   response_mask=mask, logprobs=[-1.0] * len(response))
    smol = teacher(student, model="smollm2-135m-instruct")
    assert not smol.same
    asyncio.run(smol.score([t]))
    lp = t.teacher_logprobs
    assert all(v == 0.0 for v, m in zip(lp, mask, strict=True) if not m)
    assert all(v < 0 for v in lp[:len(first)])  # every student token of the first piece covers text
    # The first piece's share is the teacher's log-prob of its text after the prompt's text, computed directly.
    ttok = smol.tokenizer
    context = ttok(student.decode(prompt, skip_special_tokens=True), add_special_tokens=False)["input_ids"]
    ids = ([ttok.bos_token_id] if ttok.bos_token_id is not None else []) + context
    text_ids = ttok(student.decode(first), add_special_tokens=False)["input_ids"]
    direct = sum(asyncio.run(smol.logprobs([(ids + text_ids, len(ids))]))[0][0])
    assert sum(lp[:len(first)]) == pytest.approx(direct, abs=1e-4)
    # The student's end of turn is the teacher's: a likely token after a finished answer, not text.
    assert lp[-1] > -15
    # Given the prompt's messages, the teacher renders them with its own template instead.
    messages = [{"role": "user", "content": "What is 6 times 7?"}]
    asyncio.run(smol.score([t], lambda traj: messages))
    rendered = ttok(ttok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                    add_special_tokens=False)["input_ids"]
    assert sum(t.teacher_logprobs[:len(first)]) == pytest.approx(
        sum(asyncio.run(smol.logprobs([(rendered + text_ids, len(rendered))]))[0][0]), abs=1e-4)
    assert sum(t.teacher_logprobs[:len(first)]) != pytest.approx(direct, abs=1e-2)


@pytest.fixture(scope="module")
def smollm2_that_never_ends(smollm2, tmp_path_factory):
    """SmolLM2-135M-Instruct whose output row of its end of turn is turned around (its input embedding
    kept): a model of another tokenizer that has not learnt to end a turn, as a base model has not."""
    out = tmp_path_factory.mktemp("never-ends")
    model, tok = load_model(smollm2), model_sources.load_tokenizer(smollm2)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    model.config.tie_word_embeddings = False
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=False)
    with torch.no_grad():
        head.weight.copy_(model.get_input_embeddings().weight)
        head.weight[end] *= -3.0
    model.lm_head = head
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


@pytest.mark.slow
def test_a_teacher_that_never_ends_a_turn_leaves_the_students_end_of_turn_alone(
        smollm2, smollm2_that_never_ends, tiny_qwen3_path):
    """A teacher of another tokenizer gives the student's end of turn its own end of turn's log-prob only
    where it has learnt it (a probe turn of its template, above a uniform guess): issue 84's base Gemma
    gave it -13.9 (-13.7 of advantage on every turn the student ended, its other tokens summing to -1), and
    the student stopped ending its turns. Elsewhere the student's own log-prob: advantage 0 there."""
    student = model_sources.load_tokenizer(tiny_qwen3_path)
    prompt = student.encode("<|im_start|>user\nWhat is 6 times 7?<|im_end|>\n<|im_start|>assistant\n")
    answer = student.encode("The answer is 42.")
    response = [*answer, student.convert_tokens_to_ids("<|im_end|>")]
    logprobs = [-0.5] * len(response)
    for model, learnt in ((smollm2, True), (smollm2_that_never_ends, False)):
        t = Trajectory(trajectory_id="x", sample_index=0, group=0, prompt_ids=prompt, response_ids=response,
                       response_mask=[1] * len(response), logprobs=logprobs)
        scorer = teacher(student, model=model)
        assert scorer.ends_turns is learnt
        asyncio.run(scorer.score([t]))
        assert all(v < 0 for v in t.teacher_logprobs[:-1])
        assert (t.teacher_logprobs[-1] == logprobs[-1]) is not learnt
        advantage = token_advantages([t], build_estimator(OPD), len(response), OPD)[0, -1].item()
        assert (advantage == 0.0) is not learnt


# -- settings refused before any model loads --------------------------------------------------------


@pytest.mark.parametrize(("settings", "fragments"), [
    ({"advantage": "opd"}, ["algorithm.advantage", "algorithm.teacher is unset"]),
    ({"advantage": "opd", "teacher": {"model": "tiny-qwen3", "weight": -1}}, ["algorithm.teacher", "weight"]),
    ({"advantage": "opd", "teacher": {"model": "tiny-qwen3", "engine": "vllm"}}, ["algorithm.teacher", "engine"]),
    ({"advantage": "opd", "teacher": {"model": "tiny-qwen3", "options": {"base_url": "http://127.0.0.1:9/v1"}}},
     ["algorithm.teacher.0", "engine.options", "base_url"]),
    ({"advantage": "opd", "teacher": {"model": "tiny-qwen3", "routes": ["nowhere"]}}, ["nowhere", "arithmetic"]),
    ({"advantage": "opd", "advantage_options": {"reward_weight": 1000}, "teacher": {"model": "tiny-qwen3"}},
     ["reward_weight"]),
    ({"advantage": "opd", "teacher": {"model": "/nonexistent/teacher"}}, ["algorithm.teacher", "/nonexistent"]),
    ({"teacher": {"model": "tiny-qwen3"}}, ["algorithm.teacher", "advantage=grpo reads no teacher"]),
    ({"advantage": "opd", "advantage_options": {"reward_weight": 0.5, "reward_advantage": "gae"},
      "teacher": {"model": "tiny-qwen3"}}, ["algorithm.advantage_options", "reward_advantage=gae"]),
    ({"advantage": "opd", "advantage_options": {"reward_weight": 0.5, "reward_advantage": "nope"},
      "teacher": {"model": "tiny-qwen3"}}, ["algorithm.advantage_options", "unknown advantage estimator 'nope'"]),
    ({"advantage": "opd", "advantage_options": {"baseline": "vopd"}, "teacher": {"model": "tiny-qwen3"}},
     ["algorithm.advantage_options", "baseline vopd", "top_k is 0"]),
    ({"advantage": "opd", "loss": "topk_forward_kl", "teacher": {"model": "tiny-qwen3"}},
     ["algorithm.loss", "topk_forward_kl", "advantage_options.top_k"]),
    ({"advantage": "grpo", "loss": "topk_forward_kl"}, ["algorithm.loss", "topk_forward_kl"]),
    ({"advantage": "opd", "loss": "topk_forward_kl", "advantage_options": {"top_k": 4, "reward_weight": 0.5},
      "teacher": {"model": "tiny-qwen3"}}, ["algorithm.loss", "reward_weight would be ignored"]),
])
def test_bad_teacher_settings_are_one_line_before_any_model_loads(tmp_path, settings, fragments):
    one_error_line(invoke("train", str(write_config(tmp_path, algorithm=settings)), "--check"), *fragments)


@pytest.mark.slow
@pytest.mark.parametrize("variant", [{}, {"advantage_options": {"top_k": 4, "baseline": "vopd"}},
                                     {"advantage_options": {"top_k": 4}, "loss": "topk_forward_kl"}])
def test_a_training_run_has_its_teacher_score_every_batch(tmp_path, variant):
    """``toolrl train`` with ``advantage: opd`` (plain, with vOPD's baseline, with the top-k forward KL): the
    teacher scores each step's trajectories before the step (``teacher_s``), and the traces keep its
    log-probs beside the engine's (and its top-k)."""
    import json

    config = write_config(tmp_path, rollout={"n": 2, "max_response_tokens": 8, "max_turns": 1}, data={"batch_size": 2},
                          algorithm={"advantage": "opd", "teacher": {"model": "tiny-qwen3"}, **variant})
    result = invoke("train", str(config))
    assert result.exit_code == 0, result.stderr
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["teacher_s"] > 0 and row["advantage_abs_mean"] < 1e-5  # the teacher is the student's weights
    assert abs(row["loss"]) < 1e-5
    traces = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_00001.jsonl").read_text().splitlines()]
    assert all(len(t["teacher_logprobs"]) == len(t["response_ids"]) for t in traces)
    if variant:
        assert all(len(row) == 4 * m for t in traces for row, m in zip(t["teacher_top_ids"], t["response_mask"],
                                                                       strict=True))


@pytest.mark.parametrize("kind", ["no model", "no end of turn"])
def test_a_teacher_that_cannot_score_is_one_line_before_any_model_loads(tmp_path, smollm2, kind):
    """A directory with a tokenizer but no model; a model whose template ends an assistant turn with
    no special token (the student's end of turn has nothing to be scored as)."""
    import shutil

    teacher = tmp_path / "teacher"
    teacher.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json") + (("config.json",) if kind != "no model" else ()):
        shutil.copy2(f"{smollm2}/{name}", teacher / name)
    (teacher / "chat_template.jinja").write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                                                 "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    fragments = ["algorithm.teacher", "no " + str(teacher / "config.json")] if kind == "no model" else [
        "algorithm.teacher.0.model", "cannot render a conversation", "holds no special token"]
    config = write_config(tmp_path, algorithm={"advantage": "opd", "teacher": {"model": str(teacher)}})
    one_error_line(invoke("train", str(config), "--check"), *fragments)


def test_groups_of_one_are_refused_only_when_the_reward_is_mixed_in(tmp_path):
    """Pure distillation compares no trajectories (``rollout.n: 1`` trains); the reward's part through
    ``grpo`` does, and is refused as ``grpo`` is."""
    teacher = {"model": "tiny-qwen3"}
    mixed = write_config(tmp_path, rollout={"n": 1}, algorithm={"advantage": "opd", "teacher": teacher,
                                                                "advantage_options": {"reward_weight": 0.5}})
    one_error_line(invoke("train", str(mixed), "--check"), "rollout.n", "grpo compares each trajectory")
    pure = write_config(tmp_path, rollout={"n": 1}, algorithm={"advantage": "opd", "teacher": teacher})
    assert invoke("train", str(pure), "--check").exit_code == 0


def test_opd_with_full_fine_tuning_is_a_warning_and_under_lora_none(tmp_path):
    """Measured (docs/benchmarks.md): under full fine-tuning the student passes its teacher and then falls
    (9-22/64 at step 48) while its KL to the teacher grows; with the output head frozen, or under LoRA, the
    KL settles near 0 and the student stays at its teacher's level. The run says so before it starts."""
    teacher = {"model": "tiny-qwen3"}
    result = invoke("train", str(write_config(tmp_path, algorithm={"advantage": "opd", "teacher": teacher})), "--check")
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: model.lora: opd with full fine-tuning"), result.stderr
    assert "output head" in lines[0] and "AdamW" in lines[0]
    for model in ({"lora": {"r": 4}}, {"freeze_output_head": True}):
        config = write_config(tmp_path, model={"source": "tiny-qwen3", **model},
                              algorithm={"advantage": "opd", "teacher": teacher})
        result = invoke("train", str(config), "--check")
        assert result.exit_code == 0 and "warning" not in result.stderr, (model, result.stderr)
    config = write_config(tmp_path, model={"source": "tiny-qwen3", "lora": {"r": 4}, "freeze_output_head": True})
    one_error_line(invoke("train", str(config), "--check"), "model.freeze_output_head", "under model.lora")


@pytest.mark.slow
def test_a_frozen_output_head_is_the_loaded_one_after_training_and_export(tmp_path):
    """``model.freeze_output_head`` (full fine-tuning, the fix for the drift above without LoRA): a step moves
    the decoder's weights and leaves the head (the tiny Qwen3's, tied to its input embeddings) bit for bit,
    and the export, whose checkpoint holds no head, takes it from the model source."""
    from toolrl.model_sources import tiny_qwen3

    config = write_config(tmp_path, model={"source": "tiny-qwen3", "freeze_output_head": True},
                          reward={"functions": [{"name": "format", "options": {"pattern": "e"}}]},
                          rollout={"max_new_tokens": 6, "max_response_tokens": 6}, optim={"lr": 0.05})
    result = invoke("train", str(config))
    assert result.exit_code == 0, result.stderr
    assert invoke("export", str(tmp_path / "run"), str(tmp_path / "hf")).exit_code == 0
    base, trained = load_model(tiny_qwen3()).state_dict(), load_model(str(tmp_path / "hf")).state_dict()
    head = "lm_head.weight" if "lm_head.weight" in trained else "model.embed_tokens.weight"
    assert torch.equal(trained[head], base[head]) and torch.equal(trained["model.embed_tokens.weight"],
                                                                  base["model.embed_tokens.weight"])
    assert not torch.equal(trained["model.layers.0.self_attn.q_proj.weight"],
                           base["model.layers.0.self_attn.q_proj.weight"])


def test_freeze_output_head_on_a_model_that_names_none_is_one_line(monkeypatch):
    from pathlib import Path

    from toolrl import model_sources
    from toolrl.config import ConfigError, load_config
    from toolrl.training.policy import build_policy

    model = load_model(model_sources.tiny_qwen3())
    monkeypatch.setattr(type(model), "get_output_embeddings", lambda self: None)
    monkeypatch.setattr(model_sources, "load_model", lambda *args, **kwargs: model)
    config = load_config(Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml", ["model.freeze_output_head=true"])
    with pytest.raises(ConfigError, match="model.freeze_output_head: 'tiny-qwen3' names no output head"):
        build_policy(config, "unused", "cpu")


# -- scoring off the step's path --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["synchronous", "stream"])
def test_groups_scored_as_they_are_generated_hold_the_whole_batchs_scores(tmp_path, schedule):
    """With a teacher, each group is scored in the teacher's thread as it is generated: the step's batch
    arrives scored, every log-prob identical to scoring the whole batch in one call, and (synchronous)
    the groups, generated one call each, are the trajectories the step's one rollout call gives."""
    from pathlib import Path

    from toolrl.config import load_config
    from toolrl.data.batches import GroupStream, StepBatches, open_batches
    from toolrl.data.draws import open_draws
    from toolrl.data.sources import load_samples
    from toolrl.processes.prepare import sample_conversation
    from toolrl.processes.resolve import resolve_run
    from toolrl.processes.start import start_processes

    tiny = Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml"
    config = load_config(tiny, [f"trainer.output_dir={tmp_path / 'run'}", "env_options.train_size=16", "rollout.n=2",
                                "rollout.max_new_tokens=8", "rollout.max_response_tokens=16", "algorithm.advantage=opd",
                                "algorithm.teacher={model: tiny-qwen3}", "data.batch_size=3",
                                f"trainer.max_staleness={0 if schedule == 'synchronous' else 1}"])
    run = resolve_run(config, "train")

    async def batches():
        processes = await start_processes(run)
        scoring = await open_teachers(config, processes.tokenizer, "algorithm.teacher", sample_conversation(run))
        stream = open_batches(processes.rollouts, open_draws(config, load_samples(config)), config, 0, 0,
                              finish=scoring.score)
        assert isinstance(stream, StepBatches if schedule == "synchronous" else GroupStream)
        try:
            batch = await stream.next(0)
            one_call = None
            if schedule == "synchronous":
                from toolrl.data.batches import batch_for_step
                from toolrl.seeds import step_seed
                from toolrl.trajectory import call_prefix

                prompts = batch_for_step(load_samples(config), 0, 3, config.trainer.seed, config.data.shuffle)
                one_call = await processes.rollouts.run(prompts, 2, seed=step_seed(config.rollout.seed, 0),
                                                    id_prefix=call_prefix("t", 1))
            whole = [t.model_copy(update={"teacher_logprobs": None}) for t in batch.trajectories]
            await scoring.score(whole)
            return [*batch.trajectories], whole, one_call, batch.finish_metrics(0.0, "teacher")
        finally:
            await stream.close()
            await processes.close()
            await scoring.close()

    scored, whole, one_call, metrics = asyncio.run(batches())
    assert len(scored) == 6 and all(t.teacher_logprobs is not None for t in scored)
    assert [t.teacher_logprobs for t in scored] == [t.teacher_logprobs for t in whole]
    assert metrics["teacher_s"] > 0 and metrics["teacher_wait_s"] >= 0.0
    if one_call is not None:
        fields = ("trajectory_id", "group", "prompt_ids", "response_ids", "response_mask", "logprobs", "reward")
        assert [[getattr(t, f) for f in fields] for t in scored] == [[getattr(t, f) for f in fields] for t in one_call]


@pytest.mark.slow
def test_a_teacher_of_another_tokenizer_is_given_each_trajectorys_own_prompt_at_every_step(tmp_path):
    """The prompt messages a teacher of another tokenizer renders are those of the sample the trajectory
    was generated from, at every step: the synchronous loop numbers each step's groups from 0, and
    looking the prompt up by group gave every later step the first step's questions (issue 84: from
    step 2 on the teacher scored the student's answers to other questions)."""
    from pathlib import Path

    from toolrl.config import load_config
    from toolrl.data.batches import StepBatches, open_batches
    from toolrl.data.draws import open_draws
    from toolrl.data.sources import load_samples
    from toolrl.processes.prepare import sample_conversation
    from toolrl.processes.resolve import resolve_run
    from toolrl.processes.start import start_processes

    tiny = Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml"
    config = load_config(tiny, [f"trainer.output_dir={tmp_path / 'run'}", "env_options.train_size=16", "rollout.n=2",
                                "rollout.max_new_tokens=2", "rollout.max_response_tokens=4", "data.batch_size=2"])
    run = resolve_run(config, "train")

    async def two_steps():
        processes = await start_processes(run)
        stream = open_batches(processes.rollouts, open_draws(config, load_samples(config)), config, 0, 0)
        assert isinstance(stream, StepBatches)
        try:
            return [t for step in range(2) for t in (await stream.next(step)).trajectories], processes.tokenizer
        finally:
            await stream.close()
            await processes.close()

    trajs, tok = asyncio.run(two_steps())
    conversation = sample_conversation(run)
    assert {t.group for t in trajs} == {0, 1} and len({t.sample_index for t in trajs}) == 4
    for t in trajs:
        question = conversation(t)[-1]["content"]
        assert question in tok.decode(t.prompt_ids)


# -- the teacher's top-k: the forward KL and vOPD's baseline -----------------------------------------

TOPK = AlgorithmConfig(advantage="opd", advantage_options={"top_k": 6}, loss="topk_forward_kl",
                       teacher={"model": "tiny-qwen3"})


def test_the_teachers_top_k_are_a_separate_forwards_and_tool_results_get_none(tiny_qwen3_path, sampled):
    trajs, tok = copy.deepcopy(sampled[0]), sampled[1]
    asyncio.run(teacher(tok, model="tiny-qwen3").score(trajs, top=6))
    model = load_model(tiny_qwen3_path).eval()
    for t in trajs:
        ids = torch.tensor([t.prompt_ids + t.response_ids])
        with torch.no_grad():
            best = torch.log_softmax(model(input_ids=ids).logits[0, len(t.prompt_ids) - 1:-1], -1).topk(6, -1)
        for c, m in enumerate(t.response_mask):
            if not m:
                assert t.teacher_top_ids[c] == [] and t.teacher_top_logprobs[c] == []
                continue
            assert t.teacher_top_ids[c] == best.indices[c].tolist()
            assert max(abs(a - b) for a, b in zip(t.teacher_top_logprobs[c], best.values[c].tolist(), strict=True)) < 1e-5


def topk_gradients(model, trajs, algo, advs=None):
    """The gradient of one micro-batch's loss under ``algo`` (advantages: the estimator's, or ``advs``),
    its per-token loss terms (B, R) and the student's log-probs at the teacher's top-k."""
    from toolrl.algorithms import LossInputs, build_loss
    from toolrl.training.step import logprobs, part_fields, policy_loss, split_mini_batches

    options = StepOptions(algo, OptimConfig(micro_batch_size=8), pad_id=0, temperature=1.0, max_response_tokens=32)
    if advs is None:
        grid = token_advantages(trajs, build_estimator(algo), 32, algo)
        advs = [grid[i, :len(t.response_ids)] for i, t in enumerate(trajs)]
    fields = part_fields(trajs, (build_estimator(algo), build_loss(algo)))
    (mini,) = split_mini_batches(trajs, advs, options, torch.device("cpu"), fields)
    ((_, batch),) = mini.micro_steps
    model.zero_grad(set_to_none=True)
    out = logprobs(model, batch, options, top=True, top_grad=CANDIDATE_LOGPROBS in build_loss(algo).reads)
    new_lp, student_top = out[..., 0], out[..., 1:]
    loss, _ = policy_loss(new_lp, new_lp.detach(), batch, algo, mini.norm, None, None, student_top)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    terms = build_loss(algo)(LossInputs(new_lp, new_lp, batch.engine_logprobs, batch.advantages, batch.response_mask,
                                        {**batch.fields, CANDIDATE_LOGPROBS: student_top})).per_token
    return grads, terms.detach(), student_top.detach(), batch


@pytest.mark.parametrize("agree", [True, False])
def test_topk_forward_kl_with_the_students_weights_as_teacher_has_no_gradient(tiny_qwen3_path, sampled, agree):
    """Teacher = the student: the top-k forward KL's gradient is 0 within 1e-6; a teacher whose top-k
    log-probs differ (control) gives one. Tool-result tokens get no loss either way."""
    trajs, tok = copy.deepcopy(sampled[0]), sampled[1]
    asyncio.run(teacher(tok, model="tiny-qwen3").score(trajs, top=6))
    if not agree:
        for t in trajs:
            t.teacher_top_logprobs = [[v * (1.0 + 0.3 * j) for j, v in enumerate(row)] for row in t.teacher_top_logprobs]
    grads, terms, _, batch = topk_gradients(load_model(tiny_qwen3_path), trajs, TOPK)
    assert (terms[batch.response_mask == 0] == 0).all()
    if agree:
        assert grads.abs().max() < 1e-6 and terms.abs().max() < 1e-6
    else:
        assert grads.abs().max() > 1e-3 and (terms[batch.response_mask == 1] > 1e-4).all()


def test_the_vopd_baseline_is_the_students_negative_reverse_kl_over_the_teachers_top_k(tiny_qwen3_path, sampled):
    """``baseline: vopd`` trains as the plain reverse-KL advantage minus w_T · Σ_v π_S(v)(log π_T(v) − log π_S(v))
    over the teacher's top-k, from the trainer's forward: the same gradient as those advantages given by hand."""
    trajs, tok = copy.deepcopy(sampled[0]), sampled[1]
    asyncio.run(teacher(tok, model="tiny-qwen3").score(trajs, top=6))
    for t in trajs:  # a teacher that disagrees, so that the baseline is not 0
        t.teacher_top_logprobs = [[v - 0.5 * j for j, v in enumerate(row)] for row in t.teacher_top_logprobs]
        t.teacher_logprobs = [v - 0.2 * m for v, m in zip(t.teacher_logprobs, t.response_mask, strict=True)]
    options = {"top_k": 6}
    vopd = AlgorithmConfig(advantage="opd", advantage_options={**options, "baseline": "vopd"}, teacher={"model": "tiny-qwen3"})
    plain = AlgorithmConfig(advantage="opd", advantage_options=options, teacher={"model": "tiny-qwen3"})
    model = load_model(tiny_qwen3_path)
    with torch.no_grad():  # peaked distributions (as benchmarks/distill.py's student): a baseline well above 0
        model.get_input_embeddings().weight.mul_(6.0)
    got, _, student_top, batch = topk_gradients(model, trajs, vopd)
    teacher_top = batch.fields["teacher_top"]
    baseline = (student_top.exp() * (teacher_top - student_top)).sum(-1) * batch.response_mask
    assert baseline[batch.response_mask == 1].abs().min() > 1e-4
    grid = token_advantages(trajs, build_estimator(plain), 32, plain)
    by_hand = [grid[i, :len(t.response_ids)] - baseline[i, :len(t.response_ids)] for i, t in enumerate(trajs)]
    want, *_ = topk_gradients(model, trajs, plain, by_hand)
    without, *_ = topk_gradients(model, trajs, plain)
    assert torch.allclose(got, want, atol=1e-6) and (got - without).abs().max() > 1e-4


def test_top_k_from_a_teacher_of_another_tokenizer_is_one_line(tmp_path, smollm2):
    config = write_config(tmp_path, algorithm={"advantage": "opd", "advantage_options": {"top_k": 4},
                                               "teacher": {"model": smollm2}})
    one_error_line(invoke("train", str(config), "--check"), "algorithm.advantage_options", "top_k=4",
                   "not the student's")
