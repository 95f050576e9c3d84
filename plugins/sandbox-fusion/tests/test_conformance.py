"""The toolrl conformance kit on ``code_interpreter`` (embedded sandbox) and its verl alias."""

from toolrl.testing import ToolConformance


class TestCodeInterpreterConformance(ToolConformance):
    tool_name = "code_interpreter"
    tool_config = {"num_workers": 8, "rate_limit": 8}
    valid_arguments = {"code": "print(6 * 7)"}
    invalid_arguments = [{"code": 1}, {"code": "print(1)", "timeout": "slow"}, {"language": "python"}]
    expected_text = "42"
    concurrent_lifecycles = 16
    check_timeout_s = 180.0


class TestVerlAliasConformance(TestCodeInterpreterConformance):
    tool_name = "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
