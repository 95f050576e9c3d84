"""The built-in model families, registered by :mod:`toolrl.plugins.builtin` through
``register_model_families`` like any plugin's (one plugin each, so any can be disabled and replaced)."""

from __future__ import annotations

from toolrl.families import Detection, ModelFamily, Template


def trl(*files: str) -> tuple[Template, ...]:
    return tuple(Template(trl=f) for f in files)


_QWEN_TOKENS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                "<tool_response>", "</tool_response>")

# Qwen3.5/3.6 and Qwen3-Coder: XML calls (<function=…><parameter=…>).
QWEN3_5 = ModelFamily(
    name="qwen3_5", parser="qwen3_coder", end_of_turn="<|im_end|>", special_tokens=_QWEN_TOKENS,
    detection=Detection(templates=trl("qwen3_5_think.jinja", "qwen3_5_nothink.jinja", "qwen3_6.jinja"),
                        markers=("<|im_start|>", "<function="), priority=30),
    training_template=Template(trl="qwen3_5_think_training.jinja"))
QWEN3 = ModelFamily(
    name="qwen3", parser="hermes", end_of_turn="<|im_end|>", special_tokens=_QWEN_TOKENS,
    detection=Detection(templates=trl("qwen3.jinja"), markers=("<|im_start|>", "<tool_call>", "<think>"),
                        priority=20),
    training_template=Template(trl="qwen3_training.jinja"))
QWEN2_5 = ModelFamily(
    name="qwen2_5", parser="hermes", end_of_turn="<|im_end|>",
    # Qwen2.5's tokenizers hold the call tags as tokens but not <tool_response> (Qwen3 added it): the
    # template writes it as text.
    special_tokens=("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"),
    detection=Detection(templates=trl("qwen2_5.jinja"), markers=("<|im_start|>", "<tool_call>"), priority=10),
    training_template=Template(trl="qwen2_5_training.jinja"))
# ChatML without tool support (SmolLM2): tool results go in as hermes-wrapped user turns. Its one
# marker is in every ChatML template, so it is tried last.
CHATML = ModelFamily(
    name="chatml", parser="hermes", end_of_turn="<|im_end|>", special_tokens=("<|im_start|>", "<|im_end|>"),
    detection=Detection(markers=("<|im_start|>",), priority=-10))
LLAMA3 = ModelFamily(
    name="llama3", parser="llama3_json", end_of_turn="<|eot_id|>", stop_tokens=("<|eom_id|>",),
    special_tokens=("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                    "<|python_tag|>"),
    detection=Detection(templates=trl("llama3_1.jinja", "llama3_2.jinja", "llama3.jinja"),
                        markers=("<|start_header_id|>", "<|eot_id|>")),
    training_template=Template(trl="llama3_training.jinja"))
DEEPSEEK_V3 = ModelFamily(
    name="deepseek_v3", parser="deepseek_v3", end_of_turn="<｜end▁of▁sentence｜>",
    special_tokens=("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                    "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
                    "<｜tool▁output▁end｜>"),
    detection=Detection(templates=trl("deepseekv3.jinja"), markers=("<｜tool▁calls▁begin｜>", "<｜Assistant｜>")),
    training_template=Template(trl="deepseekv3_training.jinja"))
# Mistral: mistral-common encodes the request (transformers' MistralCommonBackend), no jinja; detected
# from that tokenizer, or from an HF jinja template's markers. Its renderer rebuilds the model's turns
# as the structured messages the encoding reads.
MISTRAL = ModelFamily(
    name="mistral", parser="mistral", end_of_turn="</s>", renderer="toolrl.renderers.mistral:MistralRenderer",
    special_tokens=("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                    "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
    detection=Detection(tokenizer_classes=("MistralCommonBackend",), markers=("[INST]", "[TOOL_CALLS]")))
# gpt-oss: its renderer rebuilds harmony text as the structured message its template reads.
GPT_OSS = ModelFamily(
    name="gpt_oss", parser="gpt_oss", end_of_turn="<|call|>", stop_tokens=("<|return|>",),
    renderer="toolrl.renderers.harmony:HarmonyRenderer",
    special_tokens=("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>"),
    detection=Detection(templates=trl("gptoss.jinja"), markers=("<|channel|>", "<|message|>")),
    training_template=Template(trl="gptoss_training.jinja"))
GLM45 = ModelFamily(
    name="glm45", parser="glm45", end_of_turn="<|observation|>", stop_tokens=("<|user|>", "<|endoftext|>"),
    special_tokens=("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<think>",
                    "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                    "</arg_value>", "<tool_response>", "</tool_response>", "<|endoftext|>"),
    detection=Detection(templates=trl("glm4moe.jinja"), markers=("<|observation|>", "<arg_key>")),
    training_template=Template(trl="glm4moe_training.jinja"))
# Gemma 3: no tool syntax in its template (it ignores tools=, and a tool-role message breaks its
# user/model alternation), so tools go in the system prompt and results as hermes-wrapped user turns.
GEMMA3 = ModelFamily(
    name="gemma3", parser="hermes", end_of_turn="<end_of_turn>", special_tokens=("<bos>", "<start_of_turn>",
                                                                                 "<end_of_turn>"),
    detection=Detection(templates=trl("gemma3.jinja"), markers=("<start_of_turn>", "<end_of_turn>")),
    training_template=Template(trl="gemma3_training.jinja"))
# Gemma 4; TRL has no training twin.
GEMMA = ModelFamily(
    name="gemma", parser="gemma", end_of_turn="<turn|>",
    special_tokens=("<bos>", "<|turn>", "<turn|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                    "<tool_response|>", "<|channel>", "<channel|>", "<|tool>", "<tool|>", "<|think|>", '<|"|>'),
    detection=Detection(templates=trl("gemma4.jinja", "gemma4_v2.jinja", "gemma4_v3.jinja", "gemma4_v4.jinja",
                                      "gemma4_v5.jinja"), markers=("<|turn>", "<turn|>")))
