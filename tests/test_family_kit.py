"""The model-family conformance kit (toolrl.testing.families) over every built-in family that has a
template offline (Qwen's vocabulary with the family's special tokens and its TRL template), and the
kit failing a family whose end-of-turn token is not in the tokenizer."""

from __future__ import annotations

import copy

import pytest
from family_tokenizers import family_tokenizer
from toolrl.testing.families import FamilyConformance, check_family_tokens, registered_family

# chatml is detected by markers (no template of its own), mistral by its tokenizer class.
TEMPLATED = ["qwen3_5", "qwen3", "qwen2_5", "llama3", "deepseek_v3", "gpt_oss", "glm45", "gemma3", "gemma"]


@pytest.mark.slow  # a tokenizer per family: ~10 s each under load
@pytest.mark.parametrize("name", TEMPLATED)
class TestBuiltinFamilies(FamilyConformance):
    @pytest.fixture(autouse=True)
    def _family(self, name: str) -> None:
        self.family_name = name

    def tokenizer(self):
        return family_tokenizer(self.family_name)


def test_the_kit_fails_a_family_whose_end_of_turn_is_not_a_token() -> None:
    family = registered_family("qwen3").model_copy(update={"end_of_turn": "<|turn_over|>"})
    with pytest.raises(AssertionError, match=r"'<\|turn_over\|>' is not one token of the tokenizer"):
        check_family_tokens(family, copy.deepcopy(family_tokenizer("qwen3")))


@pytest.mark.parametrize("variant", ["qwen2_5", "qwen3"])
def test_qwen_families_name_only_tokens_their_real_tokenizers_hold(variant: str) -> None:
    # The upstream added-token layout (Qwen2.5 has no <tool_response> token; Qwen3 added it): a family
    # that named more would refuse every real checkpoint of its models at start.
    from toolrl.model_sources import qwen_tokenizer

    check_family_tokens(registered_family(variant), qwen_tokenizer(variant))
