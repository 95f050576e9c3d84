"""Routes: what each configured environment's samples run with (parser, tools, session, rewards, turn limit),
resolved by name once (:func:`resolve_parts`: a typo fails before anything loads) and built where the
rollout process runs (:func:`build_routes`: the tools started, samples checked against them). ``None``
is the route of samples that name no environment."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from toolrl.config import DEFAULT_MAX_TURNS, DEFAULT_PARSER, Config, ConfigError, field_where, resolve_path
from toolrl.data import origin_of
from toolrl.environments import ConfiguredEnv, Environment, configured_envs
from toolrl.families import family_named
from toolrl.plugins.parts import BuildContext, build_part, lookup_part
from toolrl.renderers.families import chat_template_text
from toolrl.rollout.rollout_context import Route
from toolrl.schemas import Sample
from toolrl.sessions import SessionKind, SharedParts
from toolrl.tools import Tool
from toolrl.tools.verl_config import (
    ToolSection,
    ToolsFile,
    build_tools,
    load_tools_file,
    parse_tools_config,
    resolve_tool_class,
)


def parser_spec(config: Config, env: Environment | None) -> tuple[str, dict[str, Any]]:
    """The parser name and options a route uses (:func:`parser_source`); options follow the parser
    (the environment's go with the environment's parser)."""
    name, _ = parser_source(config, env)
    options = config.rollout.parser_options
    if options is None:
        options = env.parser_options if env is not None and name == env.parser else {}
    return name, options


def parser_source(config: Config, env: Environment | None) -> tuple[str, str]:
    """The parser a route uses and the setting that names it: ``rollout.parser`` when set, else the
    parser of the family ``model.chat_format`` names (its model writes calls that way, whatever the
    environment's default), else the environment's."""
    if config.rollout.parser:
        return config.rollout.parser, field_where(config, "rollout.parser")
    if config.model.chat_format is not None:
        where = field_where(config, "model.chat_format")
        family = family_named(config.model.chat_format, where)
        return family.parser, f"{where} (family {family.name!r})"
    if env is not None:
        return env.parser, f"environment {env.name!r} parser"
    return DEFAULT_PARSER, "rollout.parser"


def max_turns(config: Config, c: ConfiguredEnv | None) -> int:
    """``envs.NAME.max_turns``, else ``rollout.max_turns``, else the environment's, else the default."""
    if c is not None and c.max_turns is not None:
        return c.max_turns
    return config.rollout.max_turns or (c.env.max_turns if c is not None else None) or DEFAULT_MAX_TURNS


@dataclass(frozen=True)
class ToolFiles:
    """A route's tool configs, read and checked, and the tools' schemas known before any tool is built:
    an entry's ``tool_schema``, else its class's ``schema`` (a tool that learns its schema from a
    server, MCP's, or a session's tools are not known)."""

    files: list[ToolsFile]
    schemas: list[dict[str, Any]]


def tool_files(config: Config, env: Environment | None = None) -> ToolFiles:
    """The tool configs of a route, read and checked (every ``class_name`` resolved) without building
    a tool: the explicit ``tools`` section when it is set, else ``env``'s tool entries."""
    files: list[ToolsFile] = []
    if config.tools.config_path:
        files.append(load_tools_file(resolve_path(config, config.tools.config_path)))
    if config.tools.entries:
        files.append(parse_tools_config({"tools": config.tools.entries}, Path(config.base_dir)))
    if not config.tools.explicit and env is not None and env.tools:
        files.append(parse_tools_config({"tools": env.tools}, Path(config.base_dir)))
    schemas = []
    for f in files:
        for entry in f.tools:
            tool_cls = resolve_tool_class(entry.class_name)
            # A bad key, or a file the entry names that is not there, is one line before any tool starts.
            tool_cls.check_entry(entry.config.model_dump(), ToolSection(entry.model_dump(exclude_none=True), f.base_dir))
            schema = entry.tool_schema or getattr(tool_cls, "schema", None)
            if isinstance(schema, dict):
                schemas.append(dict(schema))
    return ToolFiles(files, schemas)


async def build_route_tools(files: Sequence[ToolsFile]) -> dict[str, Tool]:
    """The tools of a route's configs, built; names must be unique across the configs."""
    made: list[Tool] = []
    tools: dict[str, Tool] = {}
    try:
        for f in files:
            built = await build_tools(f)
            made += built.values()
            for name, tool in built.items():
                if name in tools:
                    raise ConfigError(f"tools: two tools are named {name!r}")
                tools[name] = tool
    except BaseException:
        for tool in made:
            await tool.close()
        raise
    return tools


def build_rewards(config: Config, env: Environment | None = None) -> list[tuple[str, float, Any]]:
    """``reward.functions`` when set, else ``env``'s rewards."""
    explicit = config.reward.functions is not None
    terms = config.reward.functions if explicit else (env.rewards if env is not None else [])
    out = []
    for i, term in enumerate(terms or []):
        where = f"reward.functions.{i}" if explicit else f"environment {env.name!r} reward {term.name!r}"  # type: ignore[union-attr]
        context = BuildContext(field_where(config, where) if explicit else where,
                               f"{where}.options" if explicit else where, config,
                               options_field=f"{where}.options" if explicit else "")
        out.append((term.name, term.weight, build_part("reward_functions", term.name, term.options, context)))
    return out


def build_parser(config: Config, env: Environment | None = None) -> Any:
    name, options = parser_spec(config, env)
    where = parser_source(config, env)[1]
    options_where = field_where(config, "rollout.parser_options")
    # An environment's parser options are the environment's (no field of the config names them).
    field = "rollout.parser_options" if config.rollout.parser_options is not None else ""
    return build_part("tool_parsers", name, options, BuildContext(where, options_where, config, options_field=field))


def session_kind(config: Config, env: Environment | None) -> SessionKind | None:
    """The route's environment session kind: ``session.name`` when set, else the environment's; options
    follow the kind (the environment's go with the environment's kind). None: no session."""
    name = config.session.name or (env.session if env is not None else None)
    if name is None:
        return None
    options = config.session.options
    if options is None:
        options = env.session_options if env is not None and name == env.session else {}
    named_by = field_where(config, "session.name") if config.session.name or env is None \
        else f"environment {env.name!r} session"
    where = field_where(config, "session.options") if config.session.options is not None or env is None \
        else f"environment {env.name!r} session_options"
    return SessionKind.resolve(name, options, config.base_dir, named_by, where)


def build_context_policy(config: Config, env: Environment | None = None) -> Any:
    """The route's context policy (toolrl.context): ``rollout.context`` when set, else the
    environment's ``context``, else ``none``; built with ``model.max_context``."""
    if config.rollout.context is not None:
        name, options, where = config.rollout.context.name, config.rollout.context.options, "rollout.context"
    elif env is not None and env.context is not None:
        options = dict(env.context)
        name, where = str(options.pop("name", "none")), f"environment {env.name!r} context"
    else:
        name, options, where = "none", {}, "rollout.context"
    named = (field_where(config, f"{where}.name"), field_where(config, where)) if where == "rollout.context" \
        else (f"{where}.name", where)
    context = BuildContext(*named, config, {"max_context": config.model.max_context},
                           options_field=where if where == "rollout.context" else "")
    return build_part("context_policies", name, options, context)


def build_agent(config: Config) -> Any:
    """``rollout.agent``'s program (toolrl.agents), or None: toolrl's own loop runs the episodes."""
    if config.rollout.agent is None:
        return None
    agent = config.rollout.agent
    context = BuildContext(field_where(config, "rollout.agent.name"), field_where(config, "rollout.agent"), config)
    return build_part("agents", agent.name, agent.options, context)


@dataclass(frozen=True)
class RouteParts:
    """One route's parts, resolved by name; nothing here holds a resource (tools are built per role)."""

    max_turns: int
    parser: Any
    rewards: list[tuple[str, float, Any]]
    tools: ToolFiles
    session: SessionKind | None = None
    context: Any = None  # the context policy (toolrl.context)
    agent: Any = None  # the agent program (toolrl.agents)


@dataclass(frozen=True)
class Parts:
    """Every part a config names, resolved once: the engine class, the configured environments and
    one route per environment (``None``: no environment); for a training run, the parts only it uses
    (``training``: the advantage estimator, the policy loss and the weight transport, by the field
    that holds their options)."""

    engine_cls: Any
    envs: dict[str, ConfiguredEnv]
    routes: dict[str | None, RouteParts]
    training: dict[str, Any] = field(default_factory=dict)

    @property
    def parser(self) -> Any:
        """The (first) route's parser: what ``toolrl serve`` parses with."""
        return next(iter(self.routes.values())).parser


def resolve_parts(config: Config) -> Parts:
    """The engine class and every environment, parser, reward and tool config, resolved by name and
    checked: a typo fails here, before anything loads. The engine last: its module imports torch (seconds),
    the others' mistakes are one line before it."""
    if config.model.chat_format is not None:
        family_named(config.model.chat_format, field_where(config, "model.chat_format"))
    if config.model.chat_template is not None:
        chat_template_text(config, config.model.chat_template)
    envs = configured_envs(config)
    routes = resolve_routes(config, envs)
    return Parts(lookup_part("rollout_engines", config.engine.name, field_where(config, "engine.name")), envs, routes)


def resolve_routes(config: Config, envs: dict[str, ConfiguredEnv]) -> dict[str | None, RouteParts]:
    """One route's parts per configured environment (``None``: no environment); no engine needed."""
    shared = tool_files(config) if config.tools.explicit else None  # one set of tools for every route
    entries: dict[str | None, ConfiguredEnv | None] = {**envs} or {None: None}
    agent = build_agent(config)
    routes = {}
    for name, c in entries.items():
        env = c.env if c is not None else None
        routes[name] = RouteParts(max_turns(config, c), build_parser(config, env), build_rewards(config, env),
                                  shared if shared is not None else tool_files(config, env),
                                  session_kind(config, env), build_context_policy(config, env), agent)
    return routes


async def build_routes(config: Config, samples: Sequence[Sample] = (), parts: Parts | None = None,
                       ) -> tuple[dict[str | None, Route], list[Tool | SessionKind]]:
    """One route per configured environment (and the ``None`` route for samples naming none, when
    there is at most one environment), every tool built, and ``samples`` checked against their
    route's tools. ``parts``: resolved already (else the routes are resolved here; building routes
    needs no engine). Returns the routes and what to close: every tool, every session kind (what
    its sessions share)."""
    route_parts = parts.routes if parts is not None else resolve_routes(config, configured_envs(config))
    routes: dict[str | None, Route] = {}
    built: dict[int, dict[str, Tool]] = {}  # by ToolFiles: routes sharing the explicit section share its tools
    kinds: list[SessionKind] = []
    try:
        for name, route in route_parts.items():
            if id(route.tools) not in built:
                built[id(route.tools)] = await build_route_tools(route.tools.files)
            tools = built[id(route.tools)]
            # Parsers of formats that write every value as text type them from the tools' schemas.
            route.parser.bind_tools([t.tool_schema.model_dump(exclude_none=True) for t in tools.values()])
            if route.session is not None:  # what one build's sessions share is theirs alone
                kinds.append(replace(route.session, shared=SharedParts()))
                try:
                    await kinds[-1].prepare()
                except ValueError as exc:
                    raise ConfigError(str(exc)) from None
            routes[name] = Route(tools, route.max_turns, route.parser, route.rewards, config.reward,
                                 kinds[-1] if route.session is not None else None, route.context, route.agent)
        if len(routes) == 1 and None not in routes:
            routes[None] = next(iter(routes.values()))
        for name, r in routes.items():
            mine = [s for s in samples if s.env == name]
            check_samples_against_tools(mine, r.tools, f"environment {name!r}" if name else "data")
    except BaseException:
        for part in [*(t for tools in built.values() for t in tools.values()), *kinds]:
            await part.close()
        raise
    return routes, [*(t for tools in built.values() for t in tools.values()), *kinds]


def check_samples_against_tools(samples: Sequence[Sample], tool_names: Collection[str], source: str) -> None:
    """Every tool a row's ``tools_kwargs`` names must be configured: a misspelt name would otherwise
    run the tool without its per-sample arguments (e.g. no ground truth). ``source`` names samples
    that do not know their file (generated ones): ``"<source> sample N"``."""
    for i, sample in enumerate(samples, 1):
        unknown = sorted(set(sample.tools_kwargs) - set(tool_names))
        if unknown:
            origin = origin_of(sample, f"{source} sample {i}")
            field = "extra_info.tools_kwargs" if "tools_kwargs" in sample.extra_info else "tools_kwargs"
            configured = ", ".join(sorted(tool_names)) or "none"
            raise ConfigError(f"{origin}: {field}.{unknown[0]}: unknown tool (configured tools: {configured})")
