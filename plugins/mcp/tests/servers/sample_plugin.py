"""A toolrl plugin registering ``sample_tools`` (the tests expose it through a dist-info directory)."""

from toolrl.hookspecs import Register, hookimpl


@hookimpl
def register_tools(register: Register) -> None:
    register("sample_tools:MultiplyTool", name="multiply")
    register("sample_tools:PixelTool", name="pixel")
    register("sample_tools:ExplodeTool", name="explode")
