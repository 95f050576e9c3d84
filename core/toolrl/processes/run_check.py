"""The run check: what each setting means for this model and these prompts, checked before any weights
load (``toolrl train CONFIG --check`` runs it and stops). :func:`check_model_inputs` is its entry: the
tokenizer, a vision model's processor, the family's renderer, :func:`check_run` and every prompt against
the model's context, loaded once and reused by the processes built here (:class:`ModelInputs`).

:func:`check_run` asks every part the run resolved for ``part.check_run(facts)`` (:class:`RunFacts`),
which raises on a setting it cannot run with and returns warnings for one that wastes the run; then the
run's own checks: the template on a probe conversation, LoRA's targets against a meta-device skeleton,
routing replay, ``model.max_context``, ``rollout.tree`` against each route's session and tools, and the
roles (docs/plugins.md, "Checking a part against the run").
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from toolrl import model_sources
from toolrl.agent_roles import check_every_role_acts, check_roles, check_row_role, trained_roles
from toolrl.algorithms.distill import opd_options
from toolrl.config import Config, ConfigError, field_where, first_line, one_line
from toolrl.data import origin_of
from toolrl.engines.build import engine_options, engine_processor
from toolrl.plugins.parts import RunFacts, checked_options, namesake_note, options_model
from toolrl.renderers.chat import TemplateError
from toolrl.renderers.families import config_renderer_factory
from toolrl.rollout.context_check import check_prompt_tokens, model_context
from toolrl.rollout.teacher import check_teachers
from toolrl.tools.verl_config import resolve_tool_class

if TYPE_CHECKING:
    from toolrl.rollout.routes import Parts
    from toolrl.schemas import Sample

# A conversation every template must render into a prompt that holds the task and the tools and asks
# the model to answer.
PROBE_TASK = "Probe task 7301: what is 6 times 7?"
PROBE_TOOL = "probe_tool_7301"
PROBE_SCHEMA = {"type": "function", "function": {
    "name": PROBE_TOOL, "description": "A tool the run check renders.",
    "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}


def check_run(config: Config, parts: Parts, model_dir: str, tokenizer: Any, factory: Any) -> list[str]:
    """Every check of the run (module docstring); returns the warnings, raises the first error as a
    one-line ConfigError."""
    found = model_context(tokenizer, model_dir)
    window, stated = found if found is not None else (None, "")
    read = model_sources.model_config(model_dir)
    facts = RunFacts(config, model_dir, read, model_sources.text_config(read), tokenizer, window, stated)
    check_template(facts, factory)
    check_context(facts)
    check_experts(facts)
    if config.model.lora is not None:
        check_lora_targets(facts)
    check_adapters(facts, trains=bool(parts.training))
    warnings = _part_checks(facts, parts)
    if parts.training:  # distillation's teachers, each checked as the engine it is (toolrl.rollout.teacher)
        warnings += check_teachers(facts, opd_options(config.algorithm).top_k)
    check_tree(facts, parts)
    check_roles(facts, [(r.session, r.agent.options if r.agent is not None else None) for r in parts.routes.values()],
                parts.training.get("algorithm.advantage_options"))
    return warnings


def _part_checks(facts: RunFacts, parts: Parts) -> list[str]:
    """Each resolved part's ``check_run``, with the field that set it."""
    config = facts.config
    # The engine's options now, not once the engine is built on the loaded model.
    try:
        checked_options(parts.engine_cls, engine_options(config), facts.where("engine.options"), config,
                        "engine.options")
    except ConfigError as exc:
        raise ConfigError(f"{exc}{namesake_note('rollout_engines', config.engine.name)}") from None
    warnings: list[str] = []
    if options_model(parts.engine_cls).model_config.get("extra") == "allow":
        warnings.append(f"{facts.where('engine.name')}: the {config.engine.name} engine declares no Options, so "
                        "engine.options is checked only when the engine starts, after the model loads")
    checked: list[tuple[Any, str, RunFacts]] = [(parts.engine_cls, "engine.options", facts)]
    for route in parts.routes.values():
        routed = replace(facts, parser=route.parser)
        checked += [(route.parser, "rollout.parser_options", routed), (route.context, "rollout.context", routed),
                    (route.agent, "rollout.agent", routed)]
    checked += [(part, field, facts) for field, part in parts.training.items()]
    for part, field, seen in checked:
        check = getattr(part, "check_run", None)
        if part is None or not callable(check):
            continue
        try:
            warnings += list(check(seen) or ())
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(f"{facts.where(field)}: {one_line(str(exc))}") from None
    return warnings


def check_tree(facts: RunFacts, parts: Parts) -> None:
    """``rollout.tree`` clones each line's environment session and tools (toolrl.rollout.tree): a route
    whose session kind or tool cannot clone, or whose episodes an agent program runs, is refused."""
    if facts.config.rollout.tree is None:
        return
    where = facts.where("rollout.tree")
    for route in parts.routes.values():
        if route.agent is not None:
            raise ConfigError(f"{where}: an agent program ({facts.where('rollout.agent')}) runs its own episodes, "
                              "which the loop cannot clone")
        if route.session is not None and not route.session.cls.can_clone():
            raise ConfigError(f"{where}: session {route.session.name!r} ({route.session.where}) cannot clone its "
                              "state (its EnvironmentSession defines no clone)")
        for entry in (e for f in route.tools.files for e in f.tools):
            isolated = (entry.config.model_extra or {}).get("isolation") == "process"
            if isolated or not resolve_tool_class(entry.class_name).can_clone():
                raise ConfigError(f"{where}: tool {entry.class_name!r} cannot clone its per-trajectory state ("
                                  + ("it runs in a worker process)" if isolated else
                                     "it keeps it outside Tool.state and defines no Tool.clone)"))


# -- the template ------------------------------------------------------------------------------------


def template_where(config: Config, model_dir: str) -> str:
    """The setting that chose the template prompts render with."""
    for field in ("model.chat_template", "model.chat_format"):
        if getattr(config.model, field.split(".")[1]) is not None:
            return field_where(config, field)
    return f"the chat template of {model_dir}"


def check_template(facts: RunFacts, factory: Any) -> None:
    """The template compiled and rendered on a probe conversation with a tool: the prompt must hold the
    task and the tool and end in the model's turn (``factory``: the run's renderers, whose making checked
    the template's family against the tokenizer: :func:`toolrl.renderers.families.config_renderer_factory`)."""
    where = template_where(facts.config, facts.model_dir)
    messages = [{"role": "user", "content": PROBE_TASK}]
    try:
        asked = factory([PROBE_SCHEMA]).prompt_ids(messages)
    except ConfigError:
        raise
    except Exception as exc:  # jinja's syntax and render errors, a filter it does not know, ...
        raise ConfigError(f"{where}: the template does not render a conversation: {_template_error(exc)}") from None
    shown = facts.tokenizer.decode(asked)
    lacking = [what for what, text in (("the task", PROBE_TASK), ("the tools", PROBE_TOOL)) if text not in shown]
    if lacking:
        raise ConfigError(f"{where}: the template's prompt for a probe conversation lacks {' and '.join(lacking)} "
                          f"(it renders {len(asked)} tokens: {one_line(shown)[:80]!r})")
    if not shown.rpartition(PROBE_TASK)[2].strip():
        raise ConfigError(f"{where}: the template renders nothing after the user's message (no end of turn, no "
                          "generation prompt): the model would go on writing the user's turn")


def _template_error(exc: BaseException) -> str:
    exc = exc.__cause__ if isinstance(exc, TemplateError) and exc.__cause__ else exc  # the template's own error
    line = getattr(exc, "lineno", None)
    return f"{type(exc).__name__}{f' at template line {line}' if line else ''}: {one_line(str(exc))}"


# -- the context -------------------------------------------------------------------------------------


def check_context(facts: RunFacts) -> None:
    """``model.max_context`` beyond the model's window (its ``config.json``'s, read without the weights)
    is refused: the engine ends trajectories at the window, and what the run sizes from the cap (a context
    policy's trigger, a summary's room) would never come. (Prompts longer than either are refused by the
    prompt check.)"""
    cap = facts.config.model.max_context
    if cap is not None and facts.window is not None and cap > facts.window:
        raise ConfigError(f"{facts.where('model.max_context')}: {cap:,} tokens is beyond the model's context "
                          f"({facts.window:,}, {facts.window_stated}): set at most {facts.window:,}, or leave it out")


# -- experts -----------------------------------------------------------------------------------------


def check_experts(facts: RunFacts) -> None:
    """Routing replay needs a model with experts."""
    replay = facts.config.algorithm.routing_replay
    if replay != "off" and not facts.experts:
        raise ConfigError(f"{facts.where('algorithm.routing_replay')}: {replay} replays the experts each token was "
                          f"routed to, and {facts.model_dir} is a dense model (its config.json names no experts)")


# -- LoRA --------------------------------------------------------------------------------------------


def check_lora_targets(facts: RunFacts) -> None:
    """``model.lora.target_modules`` applied to the model's skeleton (:func:`_on_skeleton`): a target that
    matches nothing, matches a layer that is not Linear or one sharing a tied weight is the error it would
    be after the model loaded (:func:`toolrl.modeling.adapters.apply_lora`)."""
    from toolrl.modeling.adapters import apply_lora  # lazy: imports peft

    lora = facts.config.model.lora
    assert lora is not None
    _on_skeleton(facts, lambda model: apply_lora(model, lora))


def _on_skeleton(facts: RunFacts, inject: Callable[[Any], object]) -> None:
    """``inject`` (LoRA adapters put in place) run on the model's skeleton on the meta device, no weights
    read; its ConfigError, which starts with the config field at fault, names where that field is set."""
    try:
        inject(model_sources.model_skeleton(facts.model_dir))
    except ConfigError as exc:
        field, _, rest = str(exc).partition(": ")
        raise ConfigError(f"{facts.where(field)}: {rest}") from None


# Settings a run of several policies (model.adapters) cannot train with, and why.
_NOT_WITH_ADAPTERS = {
    "critic": "a critic (algorithm.advantage={advantage} reads its values) is one value model of one policy, "
              "and model.adapters trains several",
    "trainer.sequence_parallel": "sequence parallelism splits rows over ranks that do not route tokens to adapters",
    "trainer.world_size": "FSDP2 ranks reduce the gradients of the adapters their own rows used, which differ "
                          "from rank to rank: train several policies on one rank",
}


def check_adapters(facts: RunFacts, trains: bool) -> None:
    """``model.adapters`` (several policies on one base): each adapter's ``target_modules`` applied to the
    model's skeleton (:func:`_on_skeleton`); a run that ``trains`` needs a policy that is not
    frozen; settings the trainer cannot run several policies with are refused, naming their field."""
    config = facts.config
    adapters = config.model.adapters
    if adapters is None:
        return
    refused = {"critic": config.critic is not None, "trainer.sequence_parallel": config.trainer.sequence_parallel > 1,
               "trainer.world_size": config.trainer.world_size > 1}
    for field, why in _NOT_WITH_ADAPTERS.items():
        if refused[field]:
            # A critic the estimator asked for (no critic section written) is the estimator's setting.
            written = field != "critic" or facts.where(field) != field
            raise ConfigError(f"{facts.where(field if written else 'algorithm.advantage')}: not with model.adapters: "
                              f"{why.format(advantage=config.algorithm.advantage)}")
    if trains and not trained_roles(adapters):
        raise ConfigError(f"{facts.where('model.adapters')}: every policy is frozen ({', '.join(adapters)}): "
                          "nothing to train")
    from toolrl.modeling.adapters import apply_adapters  # lazy: imports peft

    _on_skeleton(facts, lambda model: apply_adapters(model, adapters))


@dataclass(frozen=True)
class ModelInputs:
    """The tokenizer, the processor (None but for a vision-language model) and the renderer factory
    (:func:`toolrl.renderers.families.config_renderer_factory`) of a run's model, checked."""

    tokenizer: Any
    processor: Any
    renderer_factory: Any


def check_model_inputs(config: Config, parts: Parts, path: str, prompts: Sequence[Sample]) -> ModelInputs:
    """The model's inputs, each check a one-line error: images need an engine that takes them, the
    family's tokens must be in the tokenizer, every prompt must fit the model's context (and
    ``model.max_context``), and :func:`check_run` (the template, every part's semantics) passes; its
    warnings are printed, one line each."""
    try:
        tokenizer = model_sources.load_tokenizer(path)
    except (OSError, ValueError) as exc:  # transformers' own, over several lines
        raise ConfigError(f"{field_where(config, 'model.source')}: {path} holds no tokenizer transformers can "
                          f"load ({first_line(exc)})") from None
    processor = engine_processor(config, parts.engine_cls, path, prompts)
    factory = config_renderer_factory(config, tokenizer, processor)
    for line in check_run(config, parts, path, tokenizer, factory):  # its warnings: one line each on stderr
        print(f"warning: {line}", file=sys.stderr, flush=True)
    # Each prompt as its route renders it (the template, the tools known before they are built), against
    # the model's context and model.max_context.
    for i, s in enumerate(prompts, 1):  # the role acting first, when a row names one
        check_row_role(config, f"{origin_of(s, f'the prompts sample {i}')}: extra_info.role", s.extra_info.get("role"),
                       "role" in s.extra_info)
    check_every_role_acts(config, [(r.session, r.agent) for r in parts.routes.values()], prompts)
    renderers = {name: factory(route.tools.schemas) for name, route in parts.routes.items()}
    cap = config.model.max_context
    check_prompt_tokens(prompts, tokenizer, path, processor, "the prompts", config.rollout.images,
                        cap=(cap, field_where(config, "model.max_context")) if cap is not None else None,
                        renderer_of=lambda sample: renderers.get(sample.env) or next(iter(renderers.values())))
    return ModelInputs(tokenizer, processor, factory)
