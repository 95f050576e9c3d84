import asyncio

import pytest
from toolrl.schemas import ToolCall, ToolKwargs
from toolrl.tools import Tool, ToolSet
from toolrl.tools.verl_config import ToolConfigError, build_tools, parse_tools_config


class Counter(Tool):
    """Counts calls per trajectory; rewards the count."""

    schema = {"type": "function", "function": {
        "name": "count", "description": "Add to a counter.",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["by"], "properties": {
            "by": {"type": "integer", "minimum": 1},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
            "meta": {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]},
        }}}}
    log: list[str]

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.log = []

    async def create(self, instance_id=None, **kw):
        self.log.append("create")
        iid = await super().create(instance_id, **kw)
        self.state(iid)["n"] = kw.get("start", 0)
        return iid

    async def execute(self, instance_id, arguments, **kw):
        self.log.append("execute")
        if kw.get("hang"):
            await asyncio.sleep(60)
        if kw.get("explode"):
            raise RuntimeError("kaboom")
        self.state(instance_id)["n"] += arguments["by"]
        return str(self.state(instance_id)["n"]), 0.1, {"n": self.state(instance_id)["n"]}

    async def calc_reward(self, instance_id, **kw):
        self.log.append("calc_reward")
        return float(self.state(instance_id)["n"])

    async def release(self, instance_id, **kw):
        self.log.append("release")
        await super().release(instance_id)


async def test_full_json_schema_validation_names_fields():
    tool = Counter()
    iid = await tool.create()
    cases = {
        "missing required field 'by'": {},
        "unexpected field 'extra'": {"by": 1, "extra": 2},
        "field 'by'": {"by": 0},
        "field 'tags.0'": {"by": 1, "tags": ["c"]},
        "missing required field 'meta.note'": {"by": 1, "meta": {}},
    }
    for expected, args in cases.items():
        result = await tool.call(iid, args)
        assert result.status == "invalid_arguments" and expected in result.response.text, (args, result)
    result = await tool.call(iid, "not an object")
    assert result.status == "invalid_arguments" and "JSON object" in result.response.text
    ok = await tool.call(iid, {"by": 2, "tags": ["a"], "meta": {"note": "x"}})
    assert ok.status == "ok" and ok.response.text == "2" and ok.step_reward == 0.1


async def test_state_is_isolated_per_trajectory():
    tool = Counter()
    a, b = await tool.create(start=10), await tool.create(start=100)
    await asyncio.gather(tool.call(a, {"by": 1}), tool.call(b, {"by": 5}))
    assert (await tool.calc_reward(a), await tool.calc_reward(b)) == (11.0, 105.0)


async def test_timeout_and_exception_become_error_responses():
    tool = Counter({"timeout": 0.2})
    iid = await tool.create()
    hung = await tool.call(iid, {"by": 1}, hang=True)
    assert hung.status == "timeout" and "timed out after 0.2 s" in hung.response.text
    boom = await tool.call(iid, {"by": 1}, explode=True)
    assert boom.status == "error" and "kaboom" in boom.response.text


async def test_toolset_lifecycle_runs_in_order_and_always_finishes():
    tool = Counter({"timeout": 0.2})
    ts = ToolSet({"count": tool}, {"count": ToolKwargs(create_kwargs={"start": 3}, execute_kwargs={"hang": True})})
    await ts.start()
    result = await ts.call(ToolCall(name="count", arguments={"by": 1}))
    assert result.status == "timeout"
    unknown = await ts.call(ToolCall(name="nope", arguments={}))
    assert unknown.status == "unknown_tool" and "Available tools: count" in unknown.response.text
    assert await ts.finish() == {"count": 3.0}
    assert tool.log == ["create", "execute", "calc_reward", "release"]
    assert tool._instances == {}


async def test_toolset_finishes_when_create_fails():
    class Failing(Counter):
        async def create(self, instance_id=None, **kw):
            raise OSError("no sandbox")

    ts = ToolSet({"count": Failing()})
    await ts.start()
    result = await ts.call(ToolCall(name="count", arguments={"by": 1}))
    assert result.status == "error" and "no sandbox" in result.response.text
    assert await ts.finish() == {}


def test_config_model_errors_name_the_field():
    from pydantic import BaseModel, ConfigDict

    class Opts(BaseModel):
        model_config = ConfigDict(extra="forbid")
        limit: int = 1

    class Configured(Counter):
        config_model = Opts

    assert Configured({"limit": 3, "type": "native"}).config.limit == 3
    with pytest.raises(ToolConfigError, match="config.limitt"):
        Configured({"limitt": 3})
    with pytest.raises(ToolConfigError, match="parameters is not a valid JSON Schema"):
        Counter(tool_schema={"type": "function", "function": {"name": "x", "parameters": {"type": 5}}})


async def test_verl_tool_config_with_python_class_path_and_schema_override():
    data = {"tools": [{
        "class_name": "test_tools.Counter",
        "config": {"type": "native", "timeout": 3},
        "tool_schema": {"type": "function", "function": {
            "name": "count_renamed", "description": "d",
            "parameters": {"type": "object", "properties": {"by": {"type": "integer"}}, "required": ["by"]}}},
    }]}
    tools = await build_tools(parse_tools_config(data))
    assert list(tools) == ["count_renamed"] and tools["count_renamed"].timeout == 3


def test_bad_tool_configs():
    with pytest.raises(ToolConfigError, match="class_name"):
        parse_tools_config({"tools": [{"config": {}}]})
    with pytest.raises(ToolConfigError, match="unknown tool 'nope'"):
        asyncio.run(build_tools(parse_tools_config({"tools": [{"class_name": "nope"}]})))
    with pytest.raises(ToolConfigError, match="not a toolrl.tools.Tool"):
        asyncio.run(build_tools(parse_tools_config({"tools": [{"class_name": "json.JSONDecoder"}]})))


def test_verl_schema_dumps_with_null_keywords_load():
    tool = Counter(tool_schema={"type": "function", "function": {
        "name": "code_interpreter", "description": "Run code.", "parameters": {
            "type": "object", "required": ["code"],
            "properties": {"code": {"type": "string", "description": "The code.", "enum": None}}}}})
    assert tool.tool_schema.function.parameters["properties"]["code"] == {"type": "string", "description": "The code."}


class Sibling(Tool):
    """Reads its own sibling block (as the MCP plugin reads ``mcp:``): the core passes the whole entry."""

    schema = Counter.schema
    seen: dict = {}

    @classmethod
    async def from_config(cls, config, tool_schema, section):
        block = section["weather"]
        Sibling.seen = {"block": block, "file": section.path(block["stations"]), "type": config["type"]}
        return [cls(config, tool_schema)]


async def test_sibling_blocks_belong_to_the_tool_class(tmp_path):
    import yaml
    from toolrl.tools.verl_config import load_tools_file

    (tmp_path / "stations.json").write_text("{}")
    (tmp_path / "tools.yaml").write_text(yaml.safe_dump({"tools": [{
        "class_name": "test_tools.Sibling", "config": {"type": "weather-api"},
        "weather": {"stations": "stations.json", "units": "metric"}}]}))
    tools = await build_tools(load_tools_file(tmp_path / "tools.yaml"))
    assert list(tools) == ["count"]
    assert Sibling.seen == {"block": {"stations": "stations.json", "units": "metric"},
                            "file": tmp_path / "stations.json", "type": "weather-api"}
