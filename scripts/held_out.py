"""The demos' last line: held-out success before → after, from two `toolrl eval` output directories
(and a teacher's, for scripts/distill_demo.sh).

    python scripts/held_out.py runs/NAME-eval/before runs/NAME-eval/after [runs/NAME-eval/teacher]
"""

import json
import sys
from pathlib import Path

before, after = (json.loads(Path(d, "summary.json").read_text(encoding="utf-8")) for d in sys.argv[1:3])
solved = [round(s["pass@1"] * s["num_samples"]) for s in (before, after)]
tools = before["tool_calls_per_trajectory"] or after["tool_calls_per_trajectory"]  # an agent program's are its own
per_episode = (f" (per episode: turns {before['turns_mean']:.2f} → {after['turns_mean']:.2f}, tool calls "
               f"{before['tool_calls_per_trajectory']:.2f} → {after['tool_calls_per_trajectory']:.2f})") if tools else ""
if len(sys.argv) > 3:  # a distilled student: its teacher's success beside it
    teacher = json.loads(Path(sys.argv[3], "summary.json").read_text(encoding="utf-8"))
    print(f"held-out success: student before {solved[0]}/{before['num_samples']} → after {solved[1]}/"
          f"{after['num_samples']} (teacher {round(teacher['pass@1'] * teacher['num_samples'])}/"
          f"{teacher['num_samples']})")
    sys.exit(0)
print(f"held-out success: before {solved[0]}/{before['num_samples']} → after {solved[1]}/{after['num_samples']}"
      f"{per_episode}")
