"""The run check (toolrl.processes.run_check, issue 59): a setting that cannot train, or trains nothing, is
one line before any weights load -- exit 2, the field named (with its file and line, or the override
that set it), nothing written; a setting that runs but wastes the run is one warning line.
``toolrl train CONFIG --check`` runs every check and stops.

Every run here is in process (CliRunner) with the model's weight loading made to fail the test: a
check that comes too late shows as that failure, not as the expected line."""

from __future__ import annotations

import pytest
from test_config_errors import invoke, one_error_line, write_config


@pytest.fixture(autouse=True)
def no_weights_load(monkeypatch):
    """Any model built from its weights (the policy, an engine's, a reference) fails the test."""
    from transformers import modeling_utils

    def refuse(*args, **kwargs):
        raise AssertionError("weights loaded before the run check refused the run")

    monkeypatch.setattr(modeling_utils.PreTrainedModel, "from_pretrained", classmethod(refuse))


def refused(tmp_path, *fragments, overrides=(), **sections):
    """`toolrl train` of a config with ``sections``: one error line holding ``fragments``, nothing written."""
    path = write_config(tmp_path, **sections)
    line = one_error_line(invoke("train", str(path), *overrides), *fragments)
    assert not (tmp_path / "run").exists()
    return line, path


def passes_with(tmp_path, *overrides, **sections):
    """`toolrl train --check`: exit 0, nothing written; returns stderr's warning lines."""
    path = write_config(tmp_path, **sections)
    result = invoke("train", str(path), "--check", *overrides)
    assert result.exit_code == 0, result.stderr
    assert "check passed" in result.stdout and not (tmp_path / "run").exists()
    lines = result.stderr.strip().splitlines()
    assert all(line.startswith("warning: ") for line in lines), result.stderr
    return lines


def test_the_check_passes_a_good_run_and_writes_nothing(tmp_path):
    assert passes_with(tmp_path) == []


# -- the context ----------------------------------------------------------------------------------


@pytest.mark.parametrize("context", [None, {"name": "window", "trigger_tokens": 50}])
def test_a_max_context_below_the_prompt_is_refused(tmp_path, context):
    """The prompt with its tools' schemas (the calculator's, known before it is built) is longer than
    model.max_context: every trajectory would end at once and nothing would train."""
    rollout = {"context": context} if context else {}
    line, path = refused(tmp_path, "model.max_context", "so no response fits", model={"source": "tiny-qwen3", "max_context": 100},
                         rollout=rollout)
    assert f"{path}:" in line


def test_a_max_context_beyond_the_models_is_refused_and_a_trigger_past_it_is_a_warning(tmp_path):
    """The window is the model's config.json's (no weights read): a cap past it would never be reached."""
    line, path = refused(tmp_path, "model.max_context: 65,536 tokens is beyond the model's context (32,768, "
                         "max_position_embeddings in", "set at most 32,768",
                         model={"source": "tiny-qwen3", "max_context": 65536}, rollout={"context": {"name": "window"}})
    assert line.startswith(f"error: {path}:3: ")
    assert passes_with(tmp_path, model={"source": "tiny-qwen3", "max_context": 32768}) == []
    warnings = passes_with(tmp_path, rollout={"context": {"name": "window", "trigger_tokens": 40000}})
    assert len(warnings) == 1 and "rollout.context: window's trigger_tokens is 40,000" in warnings[0], warnings
    assert "never edits" in warnings[0]


def test_a_context_policy_with_an_inline_parser_is_refused(tmp_path):
    refused(tmp_path, "rollout.context", "parser 'tags' calls tools inline",
            rollout={"parser": "tags", "context": {"name": "drop_tool_outputs", "trigger_tokens": 2000}})


# -- the algorithm ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("correction", "fragment"), [
    ({"mode": "mask", "lo": 0.1, "hi": 0.5}, "leaves out the ratio 1"),
    ({"mode": "mask", "veto": 3.0}, "veto=3.0"),
    ({"veto": 1.0}, "must be below 1"),
])
def test_a_correction_that_masks_every_on_policy_token_is_refused(tmp_path, correction, fragment):
    line, path = refused(tmp_path, "algorithm.correction", fragment, algorithm={"correction": correction})
    assert f"{path}:" in line


def test_a_truncation_cap_below_the_on_policy_ratio_is_refused(tmp_path):
    """min(ratio, cap) with cap < 1 weighs every on-policy token by the cap: a learning rate, not a correction."""
    line, path = refused(tmp_path, "algorithm.tis_cap: 0.5 is below 1, the ratio of every on-policy token",
                         algorithm={"tis_cap": 0.5})
    assert line.startswith(f"error: {path}:")


def test_settings_at_the_edge_of_what_trains_pass(tmp_path):
    """The bounds are the edges of what can train, not tighter: a mask range that starts at 1, a veto
    just under it, a truncation cap of 1, a lower clip just under 1, a max_context with room for one token
    past the prompt."""
    assert passes_with(tmp_path, algorithm={"correction": {"mode": "mask", "lo": 1.0, "hi": 1.5, "veto": 0.999},
                                            "tis_cap": 1.0, "loss_options": {"clip_eps_low": 0.999}},
                       model={"source": "tiny-qwen3", "max_context": 400}) == []


@pytest.mark.parametrize(("loss", "options", "field"), [
    ("ppo_clip", {"clip_eps_low": 1.5}, "algorithm.loss_options.clip_eps_low"),
    ("gspo", {"clip_low": 1.0}, "algorithm.loss_options.clip_low"),
    ("gspo", {"clip_lo": 0.1}, "algorithm.loss_options.clip_lo: unknown key"),
])
def test_loss_options_that_never_apply_or_do_not_exist_name_their_line(tmp_path, loss, options, field):
    line, path = refused(tmp_path, field, algorithm={"loss": loss, "loss_options": options})
    assert line.startswith(f"error: {path}:")


def test_routing_replay_on_a_dense_model_is_refused(tmp_path):
    refused(tmp_path, "algorithm.routing_replay", "r2", "dense model", algorithm={"routing_replay": "r2"})


@pytest.mark.parametrize(("options", "fragment"), [
    ({"record_routes": True}, "dense model"),
    ({"record_routes": "maybe"}, "engine.options.record_routes"),
    ({"recrd_routes": True}, "did you mean 'record_routes'"),
])
def test_engine_options_are_checked_against_the_model_before_it_loads(tmp_path, options, fragment):
    refused(tmp_path, "engine.options", fragment, engine={"name": "transformers", "options": options})


@pytest.mark.parametrize(("targets", "fragment"), [
    (["nothing_here"], "model.lora.target_modules"),
    (["embed_tokens"], "are not Linear layers"),
])
def test_lora_targets_are_matched_against_the_models_skeleton(tmp_path, targets, fragment):
    line, path = refused(tmp_path, fragment, model={"source": "tiny-qwen3", "lora": {"target_modules": targets}})
    assert f"{path}:" in line and "model.lora.target_modules" in line


# -- the template ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "fragment"), [
    ("Hello.", "lacks the task and the tools"),
    ("", "the template is empty"),
    ("{% for m in messages %}{{ m.content }}{% endfor %", "TemplateSyntaxError at template line 1"),
    ("{{ messages | shout }}", "No filter named 'shout'"),
    ("{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}\n{% endfor %}",
     "renders nothing after the user's message"),
])
def test_a_template_that_does_not_render_the_conversation_is_refused(tmp_path, body, fragment):
    (tmp_path / "chat.jinja").write_text(body)
    line, path = refused(tmp_path, "model.chat_template", fragment,
                         model={"source": "tiny-qwen3", "chat_template": "chat.jinja"})
    assert f"{path}:" in line


def test_a_template_of_another_family_is_refused_whichever_key_chose_it(tmp_path):
    refused(tmp_path, "override model.chat_template=gemma: model.chat_template", "'gemma'",
            overrides=["model.chat_template=gemma"])


# -- weight transports -----------------------------------------------------------------------------


@pytest.mark.parametrize(("transport", "options", "fragment"), [
    ("disk", {"path": "FILE"}, "is a file, not a directory"),
    ("disk", {"path": ""}, "at least 1 character"),
    ("broadcast", {"device": "tpu"}, "trainer.weight_transport_options.device"),
    ("shared_memory", {"directory": "MISSING"}, "is not a directory"),
])
def test_transport_options_are_checked_and_probed_even_in_one_process(tmp_path, transport, options, fragment):
    (tmp_path / "a_file").write_text("x")
    options = {k: {"FILE": str(tmp_path / "a_file"), "MISSING": str(tmp_path / "nope")}.get(v, v)
               for k, v in options.items()}
    refused(tmp_path, "trainer.weight_transport", fragment,
            trainer={"total_steps": 1, "output_dir": str(tmp_path / "run"), "weight_transport": transport,
                     "weight_transport_options": options})


def test_a_transport_a_single_process_run_never_uses_is_a_warning(tmp_path):
    warnings = passes_with(tmp_path, trainer={"total_steps": 1, "output_dir": str(tmp_path / "run"),
                                              "weight_transport": "disk",
                                              "weight_transport_options": {"path": str(tmp_path / "spool")}})
    assert len(warnings) == 1 and "disk is unused" in warnings[0]


def test_an_unknown_transport_names_its_line(tmp_path):
    line, path = refused(tmp_path, "trainer.weight_transport", "did you mean 'broadcast'",
                         trainer={"total_steps": 1, "output_dir": str(tmp_path / "run"), "weight_transport": "braodcast"})
    assert line.startswith(f"error: {path}:")


# -- an engine's options -----------------------------------------------------------------------------

LOOSE_ENGINE = '''
from toolrl import hookimpl
from toolrl.engines import RolloutEngine


class Loose(RolloutEngine):
    """An engine that declares no Options: its create would check what it gets, once the model loads."""
    name = "loose"

    @classmethod
    def create(cls, source, config):
        return cls()

    async def generate(self, prompt_ids, params, n=1, session_id=None):
        raise NotImplementedError

    def update_weights(self, state_dict):
        raise NotImplementedError


@hookimpl
def register_rollout_engines(register):
    register(Loose)
'''


def test_an_engine_that_declares_no_options_is_a_warning(tmp_path, monkeypatch, toolrl_reload_plugins):
    from _dists import load_plugin

    load_plugin(tmp_path, monkeypatch, toolrl_reload_plugins, "toolrl-plugin-loose", "loose", "loose_engine",
                LOOSE_ENGINE)
    warnings = passes_with(tmp_path, engine={"name": "loose", "options": {"anything": 1}})
    assert len(warnings) == 1 and warnings[0].endswith(
        "engine.name: the loose engine declares no Options, so engine.options is checked only when the engine "
        "starts, after the model loads")


def test_a_misspelt_option_of_the_scripted_engine_is_refused(tmp_path):
    refused(tmp_path, "engine.options.scrip", "unknown key", engine={"name": "scripted", "options": {"scrip": ["x"]}})


def test_each_bad_option_is_named_where_it_was_written(tmp_path):
    """A block of options set partly in the file and partly by overrides: a bad option is named after the
    line or the override that wrote it, not after whatever else set the block."""
    engine = {"name": "scripted", "options": {"script": ["x"], "scrip": ["y"]}}
    line, path = refused(tmp_path, "engine.options.scrip: unknown key", overrides=["engine.options.script=[z]"],
                         engine=engine)
    assert line.startswith(f"error: {path}:") and "override" not in line
    refused(tmp_path, "error: override engine.options.bogus=1: engine.options.bogus: unknown key",
            overrides=["engine.options.script=[z]", "engine.options.bogus=1"], engine={"name": "scripted"})
    refused(tmp_path, "error: override trainer.weight_transport_options.pth=x: "
            "trainer.weight_transport_options.pth: unknown key (did you mean 'path'?)",
            overrides=["trainer.weight_transport=disk", f"trainer.weight_transport_options.path={tmp_path}",
                       "trainer.weight_transport_options.pth=x"])


def test_a_part_that_refuses_its_options_as_it_is_built_is_named_at_their_line(tmp_path):
    """An option the part's own constructor or build refuses (a value, not a key) is named at the line
    that wrote the options, as a refused key is."""
    line, path = refused(tmp_path, "reward.functions.0.options: gsm8k reward: method must be 'strict' or 'flexible'",
                         reward={"functions": [{"name": "gsm8k", "options": {"method": "nope"}}]})
    assert line.startswith(f"error: {path}:")


def test_a_group_relative_estimator_on_groups_that_cannot_differ(tmp_path):
    """grpo, dr_grpo, rloo, reinforce_pp_baseline, gigpo and tree_grpo compare a trajectory with the rest of
    its group: a group of one trains nothing, ever (refused); greedy groups are alike unless tools or sessions
    part them (a warning). An estimator with another baseline takes groups of one."""
    refused(tmp_path, "rollout.n: grpo compares each trajectory with the rest of its group, and a group of 1 "
            "has none: every advantage is 0 and nothing trains", rollout={"n": 1})
    refused(tmp_path, "override rollout.n=1: rollout.n: rloo compares", overrides=["rollout.n=1"],
            algorithm={"advantage": "rloo"})
    # The turn-level and tree estimators inherit the group checks: their groups are the same n trajectories.
    for advantage in ("gigpo", "tree_grpo"):
        result = invoke("train", str(write_config(tmp_path)), f"algorithm.advantage={advantage}", "rollout.n=1", "--check")
        one_error_line(result, f"error: override rollout.n=1: rollout.n: {advantage} compares each trajectory with the "
                       "rest of its group, and a group of 1 has none")
    line, path = refused(tmp_path, "rollout.n: gigpo compares", rollout={"n": 1}, algorithm={"advantage": "gigpo"})
    assert line.startswith(f"error: {path}:")
    assert passes_with(tmp_path, "rollout.n=1", algorithm={"advantage": "reinforce_pp"}) == []
    (warning,) = passes_with(tmp_path, rollout={"temperature": 0})
    assert warning.endswith("rollout.temperature: greedy sampling gives a group's 4 trajectories the same tokens "
                            "unless a tool or the environment answers them apart: grpo's advantages are then 0 "
                            "and nothing trains")


def test_a_bad_tool_config_is_refused_at_the_check(tmp_path):
    """Tools are built where the rollouts run, after the model loads; their configs are checked before."""
    line, path = refused(tmp_path, "tools.entries: invalid config for tool CalculatorTool: config.zz: unknown key",
                         tools={"entries": [{"class_name": "calculator", "config": {"zz": 1}}]})
    assert line.startswith(f"error: {path}: ")
    refused(tmp_path, "config.timeout", tools={"entries": [{"class_name": "calculator", "config": {"timeout": -1}}]})
