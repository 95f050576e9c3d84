"""Mistral with Mistral's own tokenizer: mistral-common's tekken files, encoded by transformers'
MistralCommonBackend (no jinja). The model's turns are scripted in Mistral's output format; the loop,
the tokenizer's request encoding and the parser are real."""

import json
import re
from pathlib import Path

import pytest
from test_families import SAMPLE, Add
from toolrl.config import RewardConfig, RolloutConfig
from toolrl.families import tokenizer_family
from toolrl.parsers.mistral import MistralParser
from toolrl.renderers.families import renderer_factory
from toolrl.renderers.mistral import call_id
from toolrl.rollout import RolloutContext, Route, run_trajectory_pieces
from toolrl.testing import ScriptedEngine

mistral_common = pytest.importorskip("mistral_common")
pytest.importorskip("transformers.tokenization_mistral_common")

DATA = Path(mistral_common.__file__).parent / "data"
CONTROLS = ("[TOOL_CALLS]", "[CALL_ID]", "[ARGS]", "[THINK]", "[/THINK]", "</s>")


def mistral_tokenizer(version: str, tmp_path: Path):
    """The tekken vocabulary mistral-common ships (``tekken_240911.json``, a v3 file); ``v11``/``v13``:
    the same file declared that version, with the control tokens v11 and v13 read (``[ARGS]``,
    ``[CALL_ID]``, ``[THINK]``, ``[/THINK]``), which the shipped files lack, the other ranks up to
    1,000 filled as v11 files fill them (``<SPECIAL_n>``)."""
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer
    from transformers.tokenization_mistral_common import MistralCommonBackend

    path = DATA / "tekken_240911.json"
    if version != "v3":
        data = json.loads(path.read_text(encoding="utf-8"))
        data["config"]["version"] = version
        named = {32: "[ARGS]", 33: "[CALL_ID]", 34: "[THINK]", 35: "[/THINK]"}
        data["special_tokens"] = [{**t, "token_str": str(t["token_str"])} for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS] + [
            {"rank": r, "token_str": named.get(r, f"<SPECIAL_{r}>"), "is_control": True} for r in range(20, 1000)]
        path = tmp_path / f"tekken_{version}.json"
        path.write_text(json.dumps(data), encoding="utf-8")
    return MistralCommonBackend(tokenizer_path=str(path))


class ModelText:
    """Encodes text as the model writes it: Mistral's control tokens as their ids (the tokenizer's
    own ``encode`` reads ``[TOOL_CALLS]`` as plain text, as it must for user text)."""

    def __init__(self, tok):
        self.tok = tok

    def encode(self, text, add_special_tokens=False):
        ids = []
        for piece in re.split("(" + "|".join(map(re.escape, CONTROLS)) + ")", text):
            if piece in CONTROLS:
                ids.append(self.tok.convert_tokens_to_ids(piece))
            elif piece:
                ids += self.tok.encode(piece, add_special_tokens=False)
        return ids


def v11(name, arguments, id_=None):
    return f"[TOOL_CALLS]{name}" + (f"[CALL_ID]{id_}" if id_ else "") + f"[ARGS]{json.dumps(arguments)}"


def pre_v11(name, arguments, id_):
    return "[TOOL_CALLS]" + json.dumps([{"name": name, "arguments": arguments, "id": id_}])


def context(tok, texts, rule):
    parser = MistralParser()
    return RolloutContext(engine=ScriptedEngine(ModelText(tok), texts),
                          renderer_factory=renderer_factory(tok, None, rule),
                          config=RolloutConfig(template_rewrite=rule, max_response_tokens=2048),
                          routes={None: Route({"add": Add()}, 4, parser, [], RewardConfig())})


def conversation(turn_calls, texts, results=("5", "14")):
    """The final conversation as Mistral's request holds it: structured calls with their ids."""
    messages = [m.to_template() for m in SAMPLE.prompt]
    for i, calls in enumerate(turn_calls):
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": id_, "type": "function", "function": {"name": "add", "arguments": json.dumps(args)}}
            for id_, args in calls]})
        messages.append({"role": "tool", "name": "add", "content": results[i], "tool_call_id": calls[0][0]})
    messages.append({"role": "assistant", "content": texts[-1]})
    return messages


def trained(pieces):
    return [t for p in pieces for t, m in zip(p.response_ids, p.response_mask) if m]


CALLS = [[("a1b2c3d4e", {"a": 2, "b": 3})], [("f5g6h7i8j", {"a": 5, "b": 9})]]


@pytest.mark.parametrize("version", ["v3", "v11", "v13"])
async def test_three_turns_on_mistrals_tokenizer_are_its_encoding_of_the_conversation(version, tmp_path):
    """Calls with the ids the model wrote (pre-v11 ``"id"``, v11 ``[CALL_ID]``; v13 writes none, its
    calls get generated ids the encoding checks but does not write): each result names its call,
    nothing is rewritten, and the trajectory is exactly mistral-common's encoding of the final
    conversation (the last turn's ``</s>`` is the model's)."""
    tok = mistral_tokenizer(version, tmp_path)
    assert tokenizer_family(tok).name == "mistral"
    calls = [[(call_id(f"t:{turn}:0"), args)] for turn, ((_, args),) in zip((1, 2), CALLS)] if version == "v13" \
        else CALLS
    fmt = {"v3": pre_v11, "v11": v11, "v13": lambda name, args, _: v11(name, args)}[version]
    texts = [fmt("add", args, id_) for ((id_, args),) in calls] + ["The answer is 14"]
    ctx = context(tok, texts, "fork")
    pieces = await run_trajectory_pieces(ctx, SAMPLE, 0, "t", 0)
    traj = pieces[-1]
    assert len(pieces) == 1 and traj.termination == "answered" and traj.error is None, traj.error
    assert [r.response.text for r in traj.tool_results] == ["5", "14"]
    assert (traj.template_checks, traj.template_rewrites, traj.template_forks) == (2, 0, 0)
    eos = tok.convert_tokens_to_ids("</s>")
    # Masks: exactly the model's tokens are trained (the results and the prompt are not).
    assert trained(pieces) == [t for text in texts for t in ModelText(tok).encode(text) + [eos]]
    rendered = tok.apply_chat_template(conversation(calls, texts), tools=[Add.schema], continue_final_message=True,
                                       return_dict=False)
    assert traj.prompt_ids + traj.response_ids == rendered + [eos]
    # The results name their calls as the tokenizer writes them.
    text = tok.decode(traj.response_ids, skip_special_tokens=False)
    result = {"v3": '[TOOL_RESULTS]{"content": 5, "call_id": "a1b2c3d4e"}[/TOOL_RESULTS]',
              "v11": "[TOOL_RESULTS]a1b2c3d4e[TOOL_CONTENT]5[/TOOL_RESULTS]", "v13": "[TOOL_RESULTS]5[/TOOL_RESULTS]"}
    assert result[version] in text


async def test_calls_without_ids_get_generated_ones_and_the_rewrite_forks(tmp_path):
    """A v11 model that writes no ``[CALL_ID]``: each call gets a generated 9-character id that its
    result names; the request's encoding writes that id into the earlier call, a rewrite, so ``fork``
    continues from the encoding and every generated token is trained exactly once."""
    tok = mistral_tokenizer("v11", tmp_path)
    texts = [v11("add", args) for ((_, args),) in CALLS] + ["The answer is 14"]
    ctx = context(tok, texts, "fork")
    pieces = await run_trajectory_pieces(ctx, SAMPLE, 0, "t", 0)
    assert [p.termination for p in pieces] == ["forked", "forked", "answered"], pieces[-1].error
    eos = tok.convert_tokens_to_ids("</s>")
    assert trained(pieces) == [t for text in texts for t in ModelText(tok).encode(text) + [eos]]
    ids = [call_id(f"t:{turn}:0") for turn in (1, 2)]
    assert all(re.fullmatch("[A-Za-z0-9]{9}", i) for i in ids)
    last = tok.decode(pieces[-1].prompt_ids, skip_special_tokens=False)
    assert f"[TOOL_CALLS]add[CALL_ID]{ids[0]}[ARGS]" in last and f"[TOOL_RESULTS]{ids[1]}[TOOL_CONTENT]14" in last
    # The last piece continues from the encoding of the whole conversation, generated ids included.
    final = conversation([[(ids[0], CALLS[0][0][1])], [(ids[1], CALLS[1][0][1])]], texts)
    rendered = tok.apply_chat_template(final, tools=[Add.schema], continue_final_message=True, return_dict=False)
    assert pieces[-1].prompt_ids + pieces[-1].response_ids == rendered + [eos]
    kept = await run_trajectory_pieces(context(tok, texts, "keep"), SAMPLE, 0, "k", 0)
    assert len(kept) == 1 and kept[0].template_rewrites == 2


def test_mistral_is_detected_from_a_jinja_template_and_named_by_chat_format():
    from toolrl.config import ModelConfig
    from toolrl.families import detect_family

    assert detect_family("{{ '[INST]' + m + '[/INST]' }}{{ '[TOOL_CALLS]' }}").name == "mistral"
    assert ModelConfig(chat_format="mistral").chat_format == "mistral"


def test_the_parser_keeps_the_call_id_the_model_wrote():
    parsed = MistralParser().parse(v11("add", {"a": 1}, "a1b2c3d4e") + v11("add", {"a": 2}))
    assert [(c.id, c.arguments) for c in parsed.calls] == [("a1b2c3d4e", {"a": 1}), (None, {"a": 2})]
    assert MistralParser().parse(pre_v11("add", {"a": 1}, "zzzzzzzz9")).calls[0].id == "zzzzzzzz9"


@pytest.mark.parametrize("version", ["v3", "v11"])
def test_results_of_any_text_get_a_delta(version, tmp_path):
    """Before v11 a result is written as JSON: multi-line or quoted text escaped, numbers re-written."""
    tok = mistral_tokenizer(version, tmp_path)
    renderer = renderer_factory(tok, None, "keep")([Add.schema])
    for text, v3 in (('line 1\nline "2"', '"line 1\\nline \\"2\\""'), ("3.50", "3.5"), ("é", '"é"')):
        delta = tok.decode(renderer.tool_delta([renderer.tool_message(text, "add", 0, "a1b2c3d4e")]))
        assert delta == ('[TOOL_RESULTS]{"content": ' + v3 + ', "call_id": "a1b2c3d4e"}[/TOOL_RESULTS]' if version == "v3"
                         else f"[TOOL_RESULTS]a1b2c3d4e[TOOL_CONTENT]{text}[/TOOL_RESULTS]")


async def test_a_parse_error_goes_back_as_a_user_turn(tmp_path):
    """A malformed call answers no call, and mistral-common pairs every tool result with one: the
    error is a user turn ([INST]…[/INST]) and the model goes on from it."""
    tok = mistral_tokenizer("v11", tmp_path)
    texts = ["[TOOL_CALLS]add[ARGS]{\"a\": 2,", v11("add", {"a": 2, "b": 3}, "a1b2c3d4e"), "The answer is 5"]
    pieces = await run_trajectory_pieces(context(tok, texts, "keep"), SAMPLE, 0, "t", 0)
    traj = pieces[-1]
    assert traj.termination == "answered" and len(traj.parse_errors) == 1, traj.error
    text = tok.decode(traj.response_ids, skip_special_tokens=False)
    assert "</s>[INST]Error: unterminated tool call to 'add'" in text
    assert "[TOOL_RESULTS]a1b2c3d4e[TOOL_CONTENT]5[/TOOL_RESULTS]" in text


async def test_reasoning_stays_in_the_history_on_v13(tmp_path):
    """Magistral-style turns (``[THINK]…[/THINK]`` before the calls): the reasoning goes into the
    request as the turn's reasoning, which v13 encodes in every turn: exact, no rewrite."""
    tok = mistral_tokenizer("v13", tmp_path)
    texts = [f"[THINK]step {i}[/THINK]" + v11("add", args) for i, ((_, args),) in enumerate(CALLS)]
    texts.append("[THINK]done[/THINK]The answer is 14")
    pieces = await run_trajectory_pieces(context(tok, texts, "fork"), SAMPLE, 0, "t", 0)
    traj = pieces[-1]
    assert len(pieces) == 1 and traj.termination == "answered" and traj.template_rewrites == 0, traj.error
    eos = tok.convert_tokens_to_ids("</s>")
    assert trained(pieces) == [t for text in texts for t in ModelText(tok).encode(text) + [eos]]
    assert "[/INST][THINK]step 0[/THINK][TOOL_CALLS]add[ARGS]" in tok.decode(traj.prompt_ids + traj.response_ids,
                                                                           skip_special_tokens=False)
