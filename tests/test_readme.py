"""The README's first screen: what toolrl is, then the two commands (the demo and the tests) that work on a
fresh machine, the second being what CI runs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_first_screen_says_what_toolrl_is_then_shows_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()[:24]
    fence = lines.index("```bash")
    assert any("toolrl trains" in line for line in lines[:fence]), "the first screen does not say what toolrl is"
    commands = [line.split("#")[0].strip() for line in lines[fence + 1:lines.index("```", fence + 1)]]
    assert commands == ["bash scripts/quickstart.sh", "bash scripts/test.sh"]
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    assert not any("wheel" in line or "index" in line for line in lines[:fence]), "install details come after the commands"
