"""Every hook a toolrl plugin can implement (``@toolrl.hookimpl``), a plugin being a module registered under
the entry-point group ``toolrl``. Built-in parts are plugins registered through exactly the same hooks, so
each can be disabled (``TOOLRL_DISABLE_PLUGINS``) and replaced.

The registration hooks receive a callback, ``register(obj, name=None, aliases=())``, so every part is
attributed to its plugin (two plugins registering one name is an error naming both). ``obj`` is the part
or a lazy reference ``"package.module:Attribute"``, imported on first use so that ``toolrl list-plugins``
imports no part's libraries (``name`` is then required; else it defaults to ``obj.name``); ``aliases`` are
more names it answers to (the verl class path a tool replaces). Any part a run resolves may define
``check_run(facts)``, called before any weights load (docs/plugins.md, "Checking a part against the run").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pluggy

if TYPE_CHECKING:
    import click

hookspec = pluggy.HookspecMarker("toolrl")
hookimpl = pluggy.HookimplMarker("toolrl")


class Register(Protocol):
    """The callback handed to every ``register_*`` hook."""

    def __call__(self, obj: Any, name: str | None = None, aliases: tuple[str, ...] = ()) -> None: ...


@hookspec
def register_tool_parsers(register: Register) -> None:
    """Register tool-call parsers: subclasses of :class:`toolrl.parsers.ToolParser`.

    A parser turns one model response (text) into a :class:`toolrl.schemas.ParseResult`: the
    content outside calls, the calls, and one :class:`toolrl.schemas.ParseError` per malformed
    call. Parsers never raise on model output. A parser may declare ``stop_strings`` (generation
    stops there so the call can run mid-response, as inline tags do) and whether tool results are
    rendered through the chat template (``chat``) or appended inline.
    """


@hookspec
def register_tools(register: Register) -> None:
    """Register tools: subclasses of :class:`toolrl.tools.Tool`.

    A tool declares its OpenAI function schema and implements the per-trajectory lifecycle
    ``create -> execute* -> calc_reward -> release``. Tool configs (``tools:`` YAML, verl's layout)
    name a tool by its registered name or an alias; ``Tool.from_config`` may expand one config entry
    into several tools (the ``mcp`` tool does, one per server tool). A tool whose server cannot be
    reached (connection lost, the server gone) raises :class:`toolrl.InfrastructureError`: the
    trajectory ends with ``infra_error`` and is not trained; every other failure is the model's to read.
    """


@hookspec
def register_reward_functions(register: Register) -> None:
    """Register reward functions: classes whose instances are callable as below (the
    :class:`toolrl.rewards.RewardFunction` protocol); constructed with the config's ``options``.

    A reward function scores one finished trajectory from its final answer text, the sample's
    ground truth and the trajectory record (tool calls, turns), returning a float; ``async def
    __call__`` for one that waits (a judge model), awaited without holding the rollout loop. A value
    that is not a finite number (or an exception) scores 0 and is recorded as the trajectory's error
    and in its ``reward_errors``; :class:`toolrl.InfrastructureError` (its service unreachable) makes
    the trajectory ``infra_error``, not trained.
    """


@hookspec
def register_rollout_engines(register: Register) -> None:
    """Register rollout engines: subclasses of :class:`toolrl.engines.RolloutEngine`.

    An engine takes prompt token ids and returns generated token ids, per-token logprobs and a
    finish reason; it batches concurrent requests itself and takes the trainer's weights as rows
    (``load_weight_rows``, ``finish_weight_rows``: every transport's, and a full load, a delta or LoRA
    adapters alike). ``engine.name`` in a training config selects one; one that scores given tokens
    (``prompt_logprobs``) may also be a distillation teacher (``algorithm.teacher.N.engine``).
    """


@hookspec
def register_environments(register: Register) -> None:
    """Register environments: :class:`toolrl.environments.Environment` objects (pydantic models,
    validated when built).

    An environment bundles what one task needs: its dataset splits (local parquet/JSONL files, a
    Hugging Face ``datasets`` id, or a generator), system prompt and instructions, tool config
    entries (verl's layout; samples carry per-sample ``tools_kwargs``), reward functions with
    weights, the parser, ``max_turns``, the reward term that decides success (``metric``, used by
    ``toolrl eval``), its own evaluation figures (``report``), difficulty levels (``levels``, indexed by each
    training sample's ``level``: what the ``env_difficulty`` curriculum moves through) and an options model
    for the config's ``env_options``. ``env: NAME`` in a
    config selects one, ``envs: {NAME: {weight, max_turns, options}}`` mixes several, each sample
    routed to its own environment's tools, rewards, parser and turn limit. Register a lazy
    reference (``"package.module:ENVIRONMENT"``) so that listing plugins imports nothing.
    """


@hookspec
def register_loggers(register: Register) -> None:
    """Register metric loggers: subclasses of :class:`toolrl.loggers.Logger`.

    A logger receives every training step's metrics row: ``open(run_dir, config, start_step)`` once
    (``start_step`` > 0 when ``--resume`` continues a run; keep what continuing needs, such as a run
    id, in ``run_dir``), ``log(row, step)`` per step (the row as written to ``metrics.jsonl``, nested
    dicts included; :func:`toolrl.loggers.scalars` flattens it), ``close()`` at the end.
    ``trainer.loggers`` names the loggers of a run; the built-in ``jsonl`` logger (``metrics.jsonl``)
    is always on. A logger that raises is reported once and disabled; the run goes on.
    """


@hookspec
def register_advantage_estimators(register: Register) -> None:
    """Register advantage estimators: subclasses of :class:`toolrl.algorithms.AdvantageEstimator`.

    An estimator turns one step's batch (:class:`toolrl.algorithms.AdvantageInputs`: rewards (B,),
    group ids, the (B, R) response mask, and the fields it names in ``reads``: the critic's per-token
    values, each row's turns, ...) into (B, R) per-token advantages; an outcome estimator (``outcome = True``) gives each trajectory one number,
    broadcast over its tokens. Its ``Options`` pydantic model types ``algorithm.advantage_options``.
    ``algorithm.advantage: NAME`` selects one; the built-ins are ``grpo`` (the default), ``dr_grpo``,
    ``rloo``, ``reinforce_pp``, ``reinforce_pp_baseline`` and ``gae`` (with a critic; ``docs/algorithms.md``).
    """


@hookspec
def register_policy_losses(register: Register) -> None:
    """Register policy losses: subclasses of :class:`toolrl.algorithms.PolicyLoss`.

    A loss turns one micro-batch's log-probs (new, proximal, behaviour), advantages and mask
    (:class:`toolrl.algorithms.LossInputs`) into a per-token loss and where its ratio was clipped
    (:class:`toolrl.algorithms.LossTerms`); the trainer applies the truncated importance weight, the KL
    term and ``algorithm.loss_agg`` to every loss alike. Its ``Options`` pydantic model types
    ``algorithm.loss_options``; ``algorithm.loss: NAME`` selects one; the built-ins are ``ppo_clip``
    (the default), ``gspo`` and ``cispo``. Which estimator/loss pairs compose:
    :mod:`toolrl.algorithms.rules`.
    """


@hookspec
def register_model_families(register: Register) -> None:
    """Register model families: :class:`toolrl.families.ModelFamily` objects (frozen pydantic models).

    A family is what the rollout needs to know about a model's chat template: the tool parser its
    outputs need (a registered parser name), the token that ends an assistant turn and other stop
    tokens, its special tokens, how its tokenizers are recognised (tokenizer classes, templates matched
    byte for byte, from the installed ``trl`` package or inline, else markers, tried in ``priority``
    order), the history-preserving ``training_template`` and, where the built-in renderer cannot
    re-render its turns, a lazy reference to a :class:`toolrl.renderers.chat.ChatRenderer` subclass.
    ``model.chat_format: NAME`` selects one; unset, it is detected from the tokenizer. The built-ins
    (``qwen3``, ``llama3``, ``mistral``, ...) are registered the same way. Register a lazy reference
    (``"package.module:FAMILY"``) so that listing plugins imports nothing.
    """


@hookspec
def register_environment_sessions(register: Register) -> None:
    """Register environment session kinds: subclasses of :class:`toolrl.sessions.EnvironmentSession`.

    A session holds one trajectory's environment state (a simulated user, a server-side episode, a
    database copy). The class declares ``Options`` (a pydantic model, ``extra="forbid"``: typed
    ``session_options``) and ``build(options, context)``, which makes one session per trajectory; the
    rollout loop then calls ``reset(sample)`` (the trajectory's tools and first messages),
    ``step(call)`` per call of a tool the reset handed out (its result, reward and ``done``, which
    ends the trajectory), ``respond(message)`` after an answer without calls (the next user turn, or
    None to end), ``state_key()`` before each model turn (optional: a key for the environment's state,
    which ``gigpo`` groups turns by), ``score(trajectory)`` (reward terms, named parts allowed) and
    ``close()``, always.
    An environment names its kind (``Environment.session``); ``session.name`` in a config overrides it.
    A session that fails (raises, hangs, returns junk; ``step`` included) ends its own trajectory at
    once with an error, never another one; one that raises :class:`toolrl.InfrastructureError` (its
    server gone) or misses its deadline ends it with ``infra_error``, and the trajectory is not trained.
    """


@hookspec
def register_context_policies(register: Register) -> None:
    """Register context policies: subclasses of :class:`toolrl.context.ContextPolicy`.

    A policy decides what an agent's context becomes as it grows: after every round of tool results
    (and every user turn) it sees the live conversation (:class:`toolrl.context.ContextView`) and
    returns an edit (:class:`toolrl.context.ContextPlan`: the edited conversation, or a request whose
    generated reply makes it, such as a summary) or None. Each edit starts a new segment of the
    trajectory, trained token-exact (docs/rollouts.md). ``Options`` (a pydantic model) types the keys
    of ``rollout.context: {name, ...options}`` (or an environment's ``context``) besides ``name``;
    ``build(options, context)`` gets ``model.max_context`` as ``context.inputs["max_context"]``. The
    built-ins are ``none``, ``drop_tool_outputs``, ``window`` and ``summarise``.
    """


@hookspec
def register_curricula(register: Register) -> None:
    """Register curricula: subclasses of :class:`toolrl.curricula.Curriculum`.

    A curriculum decides which prompt each training group gets: the controller asks it once per group, in
    group order (``choose(group)``: a position in the training samples, :class:`toolrl.curricula.TrainingSet`),
    and shows it every finished group (``observe``: a :class:`toolrl.curricula.GroupOutcome`, its rewards with
    the policy version that sampled them and the step that trains them); ``metrics()`` adds its figures to
    each step's row, ``state_dict``/``load_state_dict`` carry it through checkpoints (JSON, checked as
    ``state_dict`` returns it, as the figures of ``metrics()`` are: docs/plugins.md). ``Options`` (a pydantic
    model) types ``data.curriculum: {name, ...options}`` besides ``name``. The built-ins are ``uniform``
    (the default), ``pass_rate`` and ``env_difficulty`` (docs/curricula.md).
    """


@hookspec
def register_weight_transports(register: Register) -> None:
    """Register weight transports: subclasses of :class:`toolrl.transports.WeightTransport`.

    A transport moves a weight sync's bytes from the trainer ranks to the engines. Each is a
    :class:`~toolrl.transports.LinkedTransport` (the built-ins all are): it opens one link per trainer
    rank to every engine's receiver (``open_sender`` on the rank, ``open_receiver`` on each engine's
    side) and streams packed buckets over it: each rank sends the shards it owns. ``trainer.weight_transport: NAME``
    selects one, its ``Options`` pydantic model types ``trainer.weight_transport_options``; the
    built-ins are ``object_store`` (the default), ``broadcast``, ``shared_memory`` and ``disk``
    (``docs/weights.md``). :func:`toolrl.testing.transports.check_weight_transport` checks one.
    """


@hookspec
def register_agents(register: Register) -> None:
    """Register agents: subclasses of :class:`toolrl.agents.Agent`.

    An agent runs an episode itself: a program (the OpenAI Agents SDK, LangGraph, a lab's own loop)
    whose model calls go to an OpenAI-compatible endpoint of the episode's own
    (:class:`toolrl.agents.Endpoint`, served by :mod:`toolrl.gateway`), where they are recorded
    token-exact and trained. ``async run(task, endpoint)`` runs one episode and returns its reward or
    None. ``rollout.agent: {name, ...options}`` selects one, its ``Options`` (extending
    :class:`toolrl.agents.AgentOptions`: ``timeout_s``, ``failure``, ``model``) typing the keys besides
    ``name``; the built-ins are ``command`` (a program per episode) and ``callable`` (an async function
    in the rollout's process), ``{command: ...}`` and ``{callable: ...}`` for short (docs/agents.md).
    """


@hookspec
def register_gateway_protocols(register: Register) -> None:
    """Register gateway protocols: subclasses of :class:`toolrl.gateway.protocols.GatewayProtocol`.

    A protocol is an API an agent program's client speaks, served on every episode's endpoint at
    ``/v1/{path}``: it ``parse`` s a request, ``answer`` s it as the chat turn it amounts to
    (:meth:`toolrl.gateway.session.GatewaySession.turn`, which renders, generates and records it for
    training), ``stream`` s the answer, writes refusals as the API does (``error_body``) and names the
    variables that point its clients at an endpoint (``environ``). The built-ins are ``chat_completions``
    and ``responses`` (OpenAI's); every one registered is served (docs/agents.md).
    """


@hookspec
def register_commands(cli: click.Group) -> None:
    """Add subcommands to the ``toolrl`` command-line interface.

    ``cli`` is the top-level :class:`click.Group`; add commands or groups to it, e.g.
    ``toolrl sandbox serve`` or ``toolrl mcp serve``, or a command to one of the core's groups
    (``cli.commands["env"]``: ``toolrl env serve``; the plugin screening hands a bare group, without
    them). Import heavy libraries inside the command function, never at module import: every
    ``toolrl`` invocation calls this hook.
    """
