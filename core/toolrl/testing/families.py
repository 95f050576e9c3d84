"""The conformance kit for model families: a registered family checked against a tokenizer that
carries its chat template (:class:`FamilyConformance`, or the ``check_family_*`` functions, which raise
``AssertionError`` saying what to fix).

The checks: every token the family names (``end_of_turn``, ``stop_tokens``, ``special_tokens``) is one
token of the tokenizer; its parser is registered; the template ends an assistant turn with the
family's end-of-turn (or a stop token), so generation stops where the template's turn ends; and the
family is the one detected from that template.
"""

from __future__ import annotations

from typing import Any, ClassVar

from toolrl.families import ModelFamily, detect_family
from toolrl.plugins.parts import lookup_part

ANSWER = "Hello there."


def registered_family(name: str) -> ModelFamily:
    """The family registered as ``name`` (the registry checks that it is a ModelFamily)."""
    return lookup_part("model_families", name, "model.chat_format")


def check_family_tokens(family: ModelFamily, tokenizer: Any) -> None:
    """Each token the family names encodes to exactly one id of ``tokenizer`` that decodes back to it."""
    for token in dict.fromkeys((family.end_of_turn, *family.stop_tokens, *family.special_tokens)):
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.decode(ids) == token, (
            f"family {family.name!r}: {token!r} is not one token of the tokenizer (it encodes to {ids}); "
            "add it to the tokenizer's special tokens or fix the family")


def check_family_parser(family: ModelFamily) -> None:
    """The family's parser is registered (the registry checks that it is a ToolParser subclass)."""
    lookup_part("tool_parsers", family.parser, f"family {family.name!r} parser")


def check_family_end_of_turn(family: ModelFamily, tokenizer: Any) -> None:
    """The template, rendering a user turn, an answer and the next user turn, follows the answer with
    the family's end-of-turn or one of its stop tokens (whitespace aside): generation stops there. For
    families rendered by the built-in renderer (no ``renderer`` of their own), whose history is what
    was generated."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ANSWER},
                                          {"role": "user", "content": "Thanks"}], tokenize=False)
    assert ANSWER in text, f"family {family.name!r}: the template drops the assistant's answer"
    after = text[text.rindex(ANSWER) + len(ANSWER):].lstrip()
    ends = (family.end_of_turn, *family.stop_tokens)
    assert after.startswith(ends), (f"family {family.name!r}: the template ends an assistant turn with "
                                     f"{after[:40]!r}, not with one of {ends}")


def check_family_detected(family: ModelFamily, tokenizer: Any) -> None:
    """A tokenizer carrying the family's template is detected as the family."""
    found = detect_family(tokenizer.chat_template)
    assert found.name == family.name, f"a tokenizer with family {family.name!r}'s template is detected as {found.name!r}"


class FamilyConformance:
    """Subclass in your plugin's tests; ``tokenizer()`` returns a tokenizer carrying the family's template::

        class TestTick(FamilyConformance):
            family_name = "tick"

            def tokenizer(self):
                return load_tokenizer(Path(__file__).parent / "tokenizer")  # toolrl.model_sources

    How to keep such a tokenizer beside your tests for a CI without network: docs/plugins.md.
    """

    family_name: ClassVar[str] = ""

    def tokenizer(self) -> Any:
        raise NotImplementedError("return a tokenizer that carries the family's chat template")

    def test_names_tokens_of_the_tokenizer(self) -> None:
        check_family_tokens(registered_family(self.family_name), self.tokenizer())

    def test_names_a_registered_parser(self) -> None:
        check_family_parser(registered_family(self.family_name))

    def test_stops_where_the_template_ends_a_turn(self) -> None:
        import pytest

        family = registered_family(self.family_name)
        if family.renderer is not None:
            pytest.skip("the family's own renderer rebuilds history (harmony writes <|end|> where it generated "
                        "<|return|>): the template's history is not what generation ends with")
        check_family_end_of_turn(family, self.tokenizer())

    def test_is_detected_from_its_template(self) -> None:
        check_family_detected(registered_family(self.family_name), self.tokenizer())
