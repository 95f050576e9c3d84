"""The child process that generates games (toolrl_textworld.games.ensure starts it with PYTHONHASHSEED=0):
reads a JSON list of game specs on stdin, writes each game's file whole (a temporary name, then renamed)
and prints one JSON line per spec: ``{"spec": ..., "error": null | "why"}``."""

from __future__ import annotations

import json
import os
import sys

from toolrl_textworld.games import GameSpec, make
from toolrl_textworld.upstream import load


def main() -> None:
    textworld = load()
    for raw in json.loads(sys.stdin.read()):
        error = None
        try:
            spec = GameSpec(**raw)
            game = make(spec, textworld)
            tmp = spec.path().with_suffix(f".{os.getpid()}.tmp")
            game.save(str(tmp))
            os.replace(tmp, spec.path())
        except Exception as exc:  # noqa: BLE001 - any generator failure is this spec's, reported by name
            error = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"spec": raw, "error": error}), flush=True)


if __name__ == "__main__":
    main()
