"""A corpus of bad configurations of the newer sections (roles, adapters, teachers, decode, environment
options, agent programs, context policies; issue 85), each refused by ``toolrl train CONFIG --check`` the
one way: exit 2, one ``error:`` line naming the file, the line the fault is on (marked ``#!`` in the
case) and the dotted field, no traceback, nothing written, no weights loaded. In process (CliRunner);
the LoRA case whose library warns runs in a process of its own, where its warnings reach stderr."""

from __future__ import annotations

import re

import pytest
from test_config_errors import invoke, one_error_line, toolrl_process
from test_run_check import no_weights_load

__all__ = ["no_weights_load"]  # its autouse fixture: weights that load before the check fail the test

# The sections every case starts from; a case's own top-level key replaces the base's.
BASE = {
    "model": "model: {source: tiny-qwen3}",
    "env": "env: arithmetic\nenv_options: {train_size: 4}",
    "trainer": "trainer: {total_steps: 1, output_dir: OUT, progress: false, plot: false}",
}

# (id, the case's YAML, the dotted field refused, a fragment of the reason). The line marked `#!` is the
# line the error must name.
CORPUS = [
    ("role listed twice", "rollout:\n  roles: [judge, writer, judge]  #!\n", "rollout.roles",
     "'judge' listed twice"),
    ("role no turn reaches", "rollout:\n  roles: [writer, critic]  #!\n", "rollout.roles",
     "'critic' can never act, so the run cannot train it"),
    ("adapter no turn reaches", "model:\n  source: tiny-qwen3\n  adapters:\n    writer: {r: 4}\n"
     "    critic: {r: 4}  #!\n", "model.adapters.critic", "'critic' can never act"),
    ("roles that are not the adapters", "model:\n  source: tiny-qwen3\n  adapters: {writer: {r: 4}, critic: {r: 4}}\n"
     "rollout:\n  roles: [writer, judge]  #!\n", "rollout.roles", "must be model.adapters' names (writer, critic)"),
    ("adapters with a critic's estimator", "model:\n  source: tiny-qwen3\n  adapters: {writer: {r: 4}}\n"
     "algorithm:\n  advantage: gae  #!\n", "algorithm.advantage", "not with model.adapters: a critic"),
    ("adapter key: rank", "model:\n  source: tiny-qwen3\n  adapters:\n    writer:\n      rank: 4  #!\n",
     "model.adapters.writer.rank", "unknown key (did you mean 'r'?)"),
    ("adapter key: froze", "model:\n  source: tiny-qwen3\n  adapters:\n    writer: {r: 4}\n    critic:\n"
     "      froze: true  #!\n", "model.adapters.critic.froze", "unknown key (did you mean 'frozen'?)"),
    ("adapter key: alpah", "model:\n  source: tiny-qwen3\n  adapters:\n    writer: {alpah: 8}  #!\n",
     "model.adapters.writer.alpah", "(did you mean 'alpha'?)"),
    ("adapter named with a dot", "model:\n  source: tiny-qwen3\n  adapters:\n    writer.v2: {r: 4}  #!\n",
     "model.adapters", "'writer.v2' cannot name a role: a letter, then at most 63 letters, digits, '_' or '-' "
     "('.' is not one"),
    ("role named with a digit first", "rollout:\n  roles:\n    - writer\n    - 2nd  #!\n", "rollout.roles.1",
     "'2nd' cannot name a role"),
    ("lora and adapters", "model:\n  source: tiny-qwen3\n  lora: {r: 4}\n  adapters: {writer: {r: 4}}  #!\n",
     "model.adapters", "set model.lora (one policy) or model.adapters"),
    ("second teacher's key", "env: arithmetic\nenvs: {}\nalgorithm:\n  advantage: opd\n  teacher:\n"
     "    - {model: tiny-qwen3}\n    - model: tiny-qwen3\n      wieght: 2  #!\n",
     "algorithm.teacher.1.wieght", "(did you mean 'weight'?)"),
    ("no teacher in a list", "algorithm:\n  advantage: opd\n  teacher: []  #!\n", "algorithm.teacher",
     "algorithm.teacher is an empty list"),
    ("decode key", "engine:\n  options:\n    decoding: static  #!\n", "engine.options.decoding",
     "(did you mean 'decode'?)"),
    ("static decode with adapters", "model:\n  source: tiny-qwen3\n  adapters: {writer: {r: 4}}\n"
     "engine:\n  options: {decode: static}  #!\n", "engine.options",
     "decode: static takes a text model that records no routes (record_routes: false) and serves no adapter per "
     "role (model.adapters)"),
    ("environment option key", "env: arithmetic\nenv_options:\n  train_size: 4\n  digit: 2  #!\n",
     "env_options.digit", "unknown key (did you mean 'digits'?)"),
    ("agent model a role misspelt", "rollout:\n  roles: [planner, executor]\n  agent:\n"
     "    command: 'true'\n    model: plannr  #!\n", "rollout.agent.model",
     "which is not among the run's roles (planner, executor; did you mean 'planner'?)"),
    ("agent program missing", "rollout:\n  agent: {command: [AGENT, --fast]}  #!\n", "rollout.agent",
     "command: AGENT does not exist"),
    ("agent program not executable", "rollout:\n  agent: {command: [SCRIPT]}  #!\n", "rollout.agent",
     "command: SCRIPT is not an executable file"),
    ("summary past the token bound", "rollout:\n  context:\n    name: summarise\n    trigger_tokens: 1000\n"
     "    max_summary_tokens: 3.0e+9  #!\n", "rollout.context.max_summary_tokens", "at most 1,048,576"),
    ("summary past the model's window", "rollout:\n  context: {name: summarise, trigger_tokens: 1000, "
     "max_summary_tokens: 40000}  #!\n", "rollout.context",
     "max_summary_tokens: 40,000 is not below the model's context (32,768"),
    ("max_context past the model's window", "model:\n  source: tiny-qwen3\n  max_context: 100000  #!\n",
     "model.max_context", "100,000 tokens is beyond the model's context (32,768, max_position_embeddings in"),
]


def write_case(tmp_path, case: str):
    """The case's config file (its sections over BASE's), with its placeholders filled in; and the line
    marked ``#!``."""
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\n")  # not executable
    text = case.replace("AGENT", str(tmp_path / "no-such-agent")).replace("SCRIPT", str(script))
    own = set(re.findall(r"^(\w+):", text, re.M))
    base = [block for key, block in BASE.items() if key not in own and not (key == "env" and "envs" in own)]
    text = "\n".join(base).replace("OUT", str(tmp_path / "run")) + "\n" + text
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    [line] = [i for i, row in enumerate(text.splitlines(), 1) if row.endswith("#!")]
    return path, line


@pytest.mark.parametrize(("case", "field", "why"), [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_each_bad_configuration_is_one_line_naming_its_file_line_and_field(tmp_path, case, field, why):
    path, line = write_case(tmp_path, case)
    why = why.replace("AGENT", str(tmp_path / "no-such-agent")).replace("SCRIPT", str(tmp_path / "agent.sh"))
    refused = one_error_line(invoke("train", str(path), "--check"))
    assert refused.startswith(f"error: {path}:{line}: {field}: "), refused
    assert why in refused, refused
    assert not (tmp_path / "run").exists()


def test_the_corpus_holds_every_kind_once():
    assert len({c[0] for c in CORPUS}) == len(CORPUS) >= 22


def test_a_lora_target_the_run_refuses_prints_no_library_warning_first(tmp_path):
    """peft warns that a tied layer is adapted before toolrl refuses the target: the refusal alone is shown."""
    path, line = write_case(tmp_path, "model:\n  source: tiny-qwen3\n  lora:\n    target_modules: [embed_tokens]  #!\n")
    done = toolrl_process("train", str(path), "--check")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"error: {path}:{line}: model.lora.target_modules: ['embed_tokens'] matches "
                                  "modules that are not Linear layers"), done.stderr
    assert not (tmp_path / "run").exists()


def test_roles_a_row_gives_turns_to_and_frozen_roles_that_sit_out_pass(tmp_path):
    """The other side of "can never act": a data row that names the second role makes it act, and a frozen
    adapter's role (a fixed opponent this environment never calls on) trains nothing anyway."""
    frozen, _ = write_case(tmp_path, "model:\n  source: tiny-qwen3\n  adapters:\n    writer: {r: 4}\n"
                           "    critic: {r: 4, frozen: true}  #!\n")
    assert invoke("train", str(frozen), "--check").exit_code == 0
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": [{"role": "user", "content": "1+1?"}]}\n'
                    '{"prompt": [{"role": "user", "content": "2+2?"}], "extra_info": {"role": "critic"}}\n')
    path, _ = write_case(tmp_path, f"data:\n  train_files: [{rows}]\nrollout:\n  roles: [writer, critic]  #!\n")
    result = invoke("train", str(path), "--check")
    assert result.exit_code == 0 and "check passed" in result.stdout, result.stderr
    rows.write_text(rows.read_text().replace('"critic"', '"writer"'))
    one_error_line(invoke("train", str(path), "--check"), "rollout.roles: 'critic' can never act")
