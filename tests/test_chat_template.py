"""``model.chat_template`` sets the template prompts render with (a jinja file next to the config, or
a family's bundled template), and a family ``model.chat_format`` names renders with its own template
unless the tokenizer's already is one of the family's."""

from functools import cache

import pytest
from toolrl.config import ConfigError, load_config
from toolrl.model_sources import qwen_tokenizer_path
from toolrl.renderers.families import config_renderer_factory
from toolrl.rollout.routes import resolve_parts

USER = [{"role": "user", "content": "What is 2 + 3?"}]


@cache
def qwen3_tokenizer():
    from toolrl import model_sources

    return model_sources.load_tokenizer(qwen_tokenizer_path("qwen3"))  # the tests' shared read (conftest)


def prompt(config) -> str:
    tok = qwen3_tokenizer()
    return tok.decode(config_renderer_factory(config, tok)([]).prompt_ids(USER))


def config_file(tmp_path, model: str):
    path = tmp_path / "run.yaml"
    path.write_text(f"env: arithmetic\nmodel:\n{model}")
    return load_config(path)


def test_a_template_file_next_to_the_config_is_rendered(tmp_path):
    (tmp_path / "plain.jinja").write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}<|im_end|>\n"
                                          "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}")
    assert prompt(config_file(tmp_path, "  chat_template: plain.jinja\n")) == \
        "[user] What is 2 + 3?<|im_end|>\n[assistant] "


def test_a_familys_bundled_template_by_name_and_the_named_familys_own(tmp_path):
    # Qwen2.5's template writes its default system turn; the tokenizer's own (Qwen3's) does not.
    default_system = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud."
    assert prompt(config_file(tmp_path, "  source: tiny-qwen3\n")).startswith("<|im_start|>user\n")
    assert prompt(config_file(tmp_path, "  chat_template: qwen2_5\n")).startswith(default_system)
    assert prompt(config_file(tmp_path, "  chat_format: qwen2_5\n")).startswith(default_system)
    # The tokenizer's template is Qwen3's own: naming its family keeps it as written.
    assert prompt(config_file(tmp_path, "  chat_format: qwen3\n")).startswith("<|im_start|>user\n")


def test_a_template_that_is_neither_a_file_nor_a_family_is_one_line_with_its_line(tmp_path):
    config = config_file(tmp_path, "  source: tiny-qwen3\n  chat_template: qwen9\n")
    with pytest.raises(ConfigError) as err:
        resolve_parts(config)
    assert str(err.value).startswith(f"{tmp_path / 'run.yaml'}:4: model.chat_template: 'qwen9' is neither a "
                                     f"template file (no {tmp_path / 'qwen9'}) nor a model family (families with "
                                     "a template: qwen3_5, qwen3, qwen2_5, ")
