"""The demos' last line: held-out success before → after, from two `toolrl eval` output directories.

    python scripts/held_out.py runs/NAME-eval/before runs/NAME-eval/after
"""

import json
import sys
from pathlib import Path

before, after = (json.loads(Path(d, "summary.json").read_text(encoding="utf-8")) for d in sys.argv[1:3])
solved = [round(s["pass@1"] * s["num_samples"]) for s in (before, after)]
tools = before["tool_calls_per_trajectory"] or after["tool_calls_per_trajectory"]  # an agent program's are its own
per_episode = (f" (per episode: turns {before['turns_mean']:.2f} → {after['turns_mean']:.2f}, tool calls "
               f"{before['tool_calls_per_trajectory']:.2f} → {after['tool_calls_per_trajectory']:.2f})") if tools else ""
print(f"held-out success: before {solved[0]}/{before['num_samples']} → after {solved[1]}/{after['num_samples']}"
      f"{per_episode}")
