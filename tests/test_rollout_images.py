"""Multimodal trajectories: an image in the prompt and one in a tool result, token-exact against the
processor's own rendering of the final conversation, with masks covering only the model's tokens."""

import io
import json

import numpy as np
import pytest
from PIL import Image
from toolrl.config import ConfigError, RewardConfig, RolloutConfig
from toolrl.data import to_sample
from toolrl.images import from_png
from toolrl.model_sources import load_processor, tiny_qwen2_5_vl
from toolrl.parsers.hermes import HermesParser
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout import RolloutContext, Route, run_trajectory
from toolrl.schemas import ToolResponse
from toolrl.testing import ScriptedEngine
from toolrl.tools import Tool

PAD = "<|image_pad|>"


class Zoom(Tool):
    """Returns the image it is asked for: a 2x zoom of a red square, or a broken one."""

    schema = {"type": "function", "function": {
        "name": "zoom", "description": "Zoom into the figure.",
        "parameters": {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"]}}}

    async def execute(self, instance_id, arguments, **kw):
        kind = arguments["kind"]
        if kind == "corrupt":
            return ToolResponse(text="zoomed", images=["aGVsbG8="]), 0.0, {}  # base64 of "hello"
        if kind == "huge":
            return ToolResponse(text="zoomed", images=[Image.new("RGB", (9000, 9000))]), 0.0, {}
        return ToolResponse(text="zoomed", images=[Image.new("RGB", (64, 96), (255, 0, 0))]), 0.0, {}


def png(width, height, seed=0):
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def call(name, **args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def processor():
    return load_processor(tiny_qwen2_5_vl())


def make_ctx(processor, engine, **cfg):
    tok = processor.tokenizer
    return RolloutContext(
        engine=engine, config=RolloutConfig(**cfg),
        renderer_factory=lambda schemas: ChatRenderer(tok, schemas, processor.chat_template, processor=processor),
        routes={None: Route({"zoom": Zoom()}, 4, HermesParser(), [], RewardConfig())})


SAMPLE_ROW = {"prompt": [{"role": "user", "content": "<image>What is the angle?"}],
              "images": [{"bytes": png(80, 56), "path": None}], "reward_model": {"ground_truth": "30"}}


async def test_image_in_prompt_and_tool_result_is_token_exact(processor):
    sample = to_sample(SAMPLE_ROW, "geo.parquet row 1")
    texts = ["Let me zoom.\n" + call("zoom", kind="ok"), "It is 30."]
    engine = ScriptedEngine(processor.tokenizer, texts)
    traj = await run_trajectory(make_ctx(processor, engine), sample, 0, "t0", seed=0)
    assert traj.termination == "answered" and traj.error is None, traj.error
    assert len(traj.images) == 2 and traj.tool_results[0].response.images == []

    # The final conversation as the processor renders it (its template, its image expansion).
    messages = [{"role": "system", "content": ChatRenderer(processor.tokenizer, [Zoom.schema], processor.chat_template,
                                                           processor=processor).prompt_messages([])[0]["content"]},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is the angle?"}]},
                {"role": "assistant", "content": texts[0]},
                {"role": "user", "content": [{"type": "text", "text": "<tool_response>\n"}, {"type": "image"},
                                             {"type": "text", "text": "zoomed\n</tool_response>"}]},
                {"role": "assistant", "content": texts[1]}]
    text = processor.apply_chat_template(messages, tokenize=False)
    pictures = [from_png(sample.images[0]), Image.new("RGB", (64, 96), (255, 0, 0))]
    expected = processor(text=[text], images=pictures, return_tensors="np")
    assert traj.prompt_ids + traj.response_ids + processor.tokenizer.encode("\n") == expected["input_ids"][0].tolist()
    assert [i.grid_thw for i in traj.images] == [tuple(g) for g in expected["image_grid_thw"].tolist()]
    assert "<tool_response>\n<|vision_start|><|image_pad|>" in processor.tokenizer.decode(traj.response_ids)

    # Masks: exactly the model's tokens; no image token is ever trained.
    pad = processor.tokenizer.convert_tokens_to_ids(PAD)
    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    trained = [t for t, m in zip(traj.response_ids, traj.response_mask) if m]
    assert trained == sum((processor.tokenizer.encode(t) + [eos] for t in texts), [])
    assert pad not in trained and pad in traj.response_ids and pad in traj.prompt_ids

    # The tool's image reached the next turn: the second generation saw both images and their tokens.
    assert [len(c.images) for c in engine.calls] == [1, 2]
    assert engine.calls[1].prompt_ids.count(pad) == sum(np.prod(g) // 4 for g in expected["image_grid_thw"].tolist())
    assert traj.template_checks == 1 and traj.template_rewrites == 0


@pytest.mark.parametrize("kind, message", [
    ("corrupt", "image 0: does not decode as an image"),
    ("huge", "over the limit of 50,000,000"),
])
async def test_a_bad_tool_image_is_an_error_result_the_model_sees(processor, kind, message):
    sample = to_sample(SAMPLE_ROW, "geo.parquet row 1")
    engine = ScriptedEngine(processor.tokenizer, [call("zoom", kind=kind), "Sorry."])
    traj = await run_trajectory(make_ctx(processor, engine), sample, 0, "t0", seed=0)
    assert traj.termination == "answered" and traj.error is None
    result = traj.tool_results[0]
    assert result.status == "error" and message in result.response.text
    assert len(traj.images) == 1
    assert message in processor.tokenizer.decode(engine.calls[1].prompt_ids)


async def test_images_over_the_trajectory_limit_are_refused_to_the_model(processor):
    sample = to_sample(SAMPLE_ROW, "geo.parquet row 1")
    engine = ScriptedEngine(processor.tokenizer, [call("zoom", kind="ok"), "Done."])
    traj = await run_trajectory(make_ctx(processor, engine, images={"max_per_trajectory": 1}), sample, 0, "t0", seed=0)
    assert traj.error is None and len(traj.images) == 1
    assert "rollout.images.max_per_trajectory" in traj.tool_results[0].response.text


async def test_large_images_are_resized_down_to_max_pixels(processor):
    sample = to_sample({**SAMPLE_ROW, "images": [png(400, 300)]}, "geo.parquet row 1")
    engine = ScriptedEngine(processor.tokenizer, ["Done."])
    traj = await run_trajectory(make_ctx(processor, engine, images={"max_pixels": 10_000}), sample, 0, "t0", seed=0)
    width, height = from_png(traj.images[0].png).size
    assert width * height <= 10_000 and abs(width / height - 4 / 3) < 0.05


def test_a_text_model_reads_the_prompt_text_only(processor):
    """Without a processor the prompt renders as before: its text, ``<image>`` and all."""
    sample = to_sample(SAMPLE_ROW, "geo.parquet row 1")
    renderer = ChatRenderer(processor.tokenizer)
    messages = [m.to_template() for m in sample.prompt]
    text = processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "<image>What is the angle?" in text
    assert renderer.prompt_ids(messages) == processor.tokenizer.encode(text)


@pytest.mark.parametrize("row, message", [
    ({"images": [b"not an image"]}, "geo.parquet row 3: images.0: does not decode as an image"),
    ({"images": [png(80, 56)[:200]]}, "geo.parquet row 3: images.0: does not decode as an image"),
    ({"images": [png(80, 56), png(8, 8)]}, "geo.parquet row 3: images: 2 images for 1 image placeholders"),
    ({"prompt": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}]}],
      "images": None}, "geo.parquet row 3: prompt.0.content.0: neither a file path nor valid base64"),
])
def test_a_bad_sample_image_is_a_one_line_data_error(row, message):
    with pytest.raises(ConfigError) as info:
        to_sample({**SAMPLE_ROW, **row}, "geo.parquet row 3")
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_oversized_sample_image_is_refused_without_decoding(tmp_path):
    # Small files with huge headers: refused from the header (PIL's own bomb cap or toolrl's).
    for side in (20_000, 8_000):
        buffer = io.BytesIO()
        Image.new("1", (side, side)).save(buffer, format="PNG")
        (tmp_path / "big.png").write_bytes(buffer.getvalue())
        row = {"prompt": [{"role": "user", "content": [{"type": "image", "image": "big.png"}]}]}
        with pytest.raises(ConfigError, match=r"^f.jsonl:1: prompt\.0\.content\.0: .*over the limit of "
                                              r"50,000,000 pixels \(rollout.images.hard_max_pixels\)$"):
            to_sample(row, "f.jsonl:1", tmp_path)


def test_jsonl_image_parts_become_sample_images(tmp_path):
    (tmp_path / "a.png").write_bytes(png(30, 20, seed=1))
    row = {"prompt": [{"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "?"}]}]}
    sample = to_sample(row, "f.jsonl:1", tmp_path)
    assert sample.prompt[0].content == [{"type": "image"}, {"type": "text", "text": "?"}]
    assert from_png(sample.images[0]).size == (30, 20)
    assert to_sample(json.loads(sample.model_dump_json()), "again").images == sample.images


def test_samples_written_back_keep_their_images(tmp_path):
    from toolrl.data import load_files, write_samples

    sample = to_sample(SAMPLE_ROW, "geo.parquet row 1")
    write_samples([sample], tmp_path / "out.jsonl")
    [again] = load_files([tmp_path / "out.jsonl"])
    assert again.images == sample.images and again.prompt == sample.prompt


class _TextOnlyEngine:  # an engine whose generate takes no images (an OpenAI-compatible server, say)
    async def generate(self, prompt_ids, params, n=1, session_id=None):
        raise AssertionError("not called")


def test_an_engine_without_images_gets_text_or_a_config_error(caplog):
    from pathlib import Path

    from toolrl.config import load_config
    from toolrl.engines.build import engine_processor
    from toolrl.model_sources import tiny_qwen3
    from toolrl.schemas import Sample

    config = load_config(Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml", ["model.source=tiny-qwen2.5-vl", "engine.name=openai"])
    figure = Sample(prompt=[{"role": "user", "content": "Find x. <image>"}], images=[png(56, 56)])
    text = Sample(prompt="2+3?")
    assert engine_processor(config, ScriptedEngine, tiny_qwen2_5_vl(), [figure]) is not None
    assert engine_processor(config, _TextOnlyEngine, tiny_qwen3(), [text]) is None  # a text model
    with pytest.raises(ConfigError, match=r"^engine.name: the openai engine takes no images, and the prompts of the "
                                          r"vision-language model tiny-qwen2.5-vl hold some: "):
        engine_processor(config, _TextOnlyEngine, tiny_qwen2_5_vl(), [text, figure])
    with caplog.at_level("WARNING"):
        assert engine_processor(config, _TextOnlyEngine, tiny_qwen2_5_vl(), [text]) is None
    assert "the openai engine takes no images: the vision-language model tiny-qwen2.5-vl reads the prompts' " \
           "text only" in caplog.text
