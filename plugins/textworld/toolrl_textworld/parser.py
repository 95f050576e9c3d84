"""The ``textworld_command`` parser: a turn's text is one command for the game, as a text game's player
types it (the first line that is not blank), made an ``act`` call. A small model writes a command, or the
number of one from a listed menu, far more often than it writes tool-call markup; the session reads both.
Generation stops at the end of the line: one command a turn."""

from __future__ import annotations

from toolrl.parsers import ToolParser
from toolrl.parsers.pythonic import TURN_END
from toolrl.schemas import ParseError, ParseResult, ToolCall

TOOL, ARGUMENT = "act", "command"


class CommandParser(ToolParser):
    name = "textworld_command"

    @property
    def stop_strings(self) -> list[str]:
        return ["\n"]

    def parse(self, text: str) -> ParseResult:
        line = next((ln for ln in TURN_END.sub("", text).splitlines() if ln.strip()), "")
        # The prompt's "> " and a closing period are how a player writes a command, not part of it.
        command = line.strip().lstrip(">").strip().rstrip(".").strip().strip("\"'`").strip()
        if not command:
            return ParseResult(content=text.strip(), errors=[ParseError(message="no command: write one command "
                                                                        "(or its number) on one line", raw=text)])
        return ParseResult(content=text.strip(), calls=[ToolCall(name=TOOL, arguments={ARGUMENT: command})])
