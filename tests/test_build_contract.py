"""One build contract for every kind of part (toolrl.plugins.parts): every registered part keeps it,
and unknown names and bad options of any kind give the same one-line error naming the field; a kind name
the contract check does not know is an error listing the kinds."""

from __future__ import annotations

import pytest
from toolrl.config import ConfigError
from toolrl.plugins import get_plugins
from toolrl.plugins.parts import BuildContext, build_part, options_model
from toolrl.plugins.registry import KINDS
from toolrl.testing import check_build_contract

REGISTERED = [(kind, name) for kind in KINDS for name in get_plugins().registry.names(kind)]


@pytest.mark.parametrize(("kind", "name"), REGISTERED, ids=[f"{k}:{n}" for k, n in REGISTERED])
def test_every_registered_part_keeps_the_build_contract(kind, name):
    check_build_contract(kind, name)


@pytest.mark.parametrize("kind", KINDS)
def test_an_unknown_name_of_any_kind_is_one_line_naming_the_field_with_a_suggestion(kind):
    names = get_plugins().registry.names(kind)
    if not names:
        pytest.skip(f"no {kind} registered")
    typo = names[0][:-1] + ("x" if names[0][-1] != "x" else "y")
    with pytest.raises(ConfigError) as caught:
        build_part(kind, typo, {}, BuildContext("some.field"))
    message = str(caught.value)
    assert message.startswith("some.field: unknown ") and "available: " in message and "\n" not in message
    assert f"did you mean {names[0]!r}?" in message


@pytest.mark.parametrize(("kind", "name", "options", "expected"), [
    ("tool_parsers", "hermes", {"x": 1}, "rollout.parser_options: parser 'hermes' takes no options"),
    ("advantage_estimators", "grpo", {"nope": 1}, "rollout.parser_options.nope: unknown key"),
    ("policy_losses", "cispo", {"max_weight": -1}, "rollout.parser_options.max_weight: Input should be greater"),
    ("reward_functions", "format", {"nope": 1}, "rollout.parser_options.nope: unknown key"),
])
def test_bad_options_of_any_kind_name_the_field(kind, name, options, expected):
    from toolrl.config import AlgorithmConfig

    context = BuildContext("rollout.parser", "rollout.parser_options", inputs={"algorithm": AlgorithmConfig()})
    with pytest.raises(ConfigError, match="^" + expected.replace(".", r"\.").replace("?", r"\?")):
        build_part(kind, name, options, context)


def test_options_come_from_the_constructor_when_a_part_declares_none():
    class Scored:
        def __init__(self, scale: float = 1.0, *, bonus: int = 0) -> None:
            self.scale, self.bonus = scale, bonus

        def __call__(self, response, ground_truth, **info):
            return self.scale

    model = options_model(Scored)
    assert model.model_validate({"scale": "2"}).scale == 2.0
    with pytest.raises(Exception, match="extra"):
        model.model_validate({"scael": 2})


@pytest.mark.parametrize(("kind", "hint"), [("curriculum", " (did you mean 'curricula'?)"),
                                            ("tool_parser", " (did you mean 'tool_parsers'?)"), ("xyz", "")])
def test_an_unknown_kind_is_one_line_listing_the_kinds(kind, hint):
    with pytest.raises(ValueError) as caught:
        check_build_contract(kind, "pass_rate")
    assert str(caught.value) == (f"unknown kind {kind!r}{hint}: a kind is a register_* hook's suffix, one of "
                                 + ", ".join(KINDS))
