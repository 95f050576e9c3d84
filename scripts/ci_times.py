"""Where a test run's minutes went, from the files its nox sessions left in .nox/times (noxfile.py: each
session's start, end and outcome as NAME.json, its pytest JUnit XML as NAME.xml).

    python scripts/ci_times.py                  # the last run in this checkout
    python scripts/ci_times.py DIR --since T    # another run's times folder; T: when the run began (epoch s)

Prints each session's wall time and the lane it ran in (scripts/test.sh runs two sessions at a time: a
session takes the lane that came free first), each lane's busy time, the 15 slowest tests with their
session, the sessions that failed, the tests passed, failed and skipped, and last ``ci wall: N s``, from T
(or the first session's start) to the last session's end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sessions(folder: Path) -> list[dict]:
    """Each session's times, with ``file``: the name its JUnit XML shares."""
    found = [{**json.loads(p.read_text()), "file": p.stem} for p in folder.glob("*.json")]
    return sorted(found, key=lambda s: s["start"])


def assign_lanes(runs: list[dict]) -> int:
    """Each session to the lane whose previous session ended last before it started (how nox --parallel
    hands a free slot to the next session); returns the number of lanes."""
    ends: list[float] = []
    for run in runs:
        free = [i for i, end in enumerate(ends) if end <= run["start"] + 1.0]
        lane = max(free, key=lambda i: ends[i]) if free else len(ends)
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = run["end"]
        run["lane"] = lane + 1
    return len(ends)


def tests(folder: Path, names: dict[str, str]) -> list[tuple[float, str, str, str]]:
    """(seconds, session, test id, outcome) of every test case in the run's JUnit files; ``names``: the
    session of each file name."""
    found = []
    for xml in folder.glob("*.xml"):
        name = names.get(xml.stem, xml.stem)
        for case in ET.parse(xml).getroot().iter("testcase"):
            outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
            test_id = f"{case.get('file') or case.get('classname', '')}::{case.get('name')}"
            found.append((float(case.get("time") or 0.0), name, test_id, outcome))
    return sorted(found, reverse=True)


def table(folder: Path, since: float | None = None, slowest: int = 15) -> str:
    runs = sessions(folder)
    if not runs:
        return f"no session times in {folder}"
    lanes = assign_lanes(runs)
    cases = tests(folder, {r["file"]: r["session"] for r in runs})
    counts: dict[str, tuple[int, float]] = {}
    for seconds, name, _, _ in cases:
        n, total = counts.get(name, (0, 0.0))
        counts[name] = (n + 1, total + seconds)
    lines = ["| session | lane | wall s | tests | in tests s | outcome |", "|---|---|---|---|---|---|"]
    for run in runs:
        n, in_tests = counts.get(run["session"], (0, 0.0))
        lines.append(f"| {run['session']} | {run['lane']} | {run['end'] - run['start']:.0f} | {n or ''} | "
                     f"{f'{in_tests:.0f}' if n else ''} | {'ok' if run['ok'] else 'FAILED'} |")
    for lane in range(1, lanes + 1):
        mine = [r for r in runs if r["lane"] == lane]
        busy = sum(r["end"] - r["start"] for r in mine)
        lines.append(f"| lane {lane} busy | {lane} | {busy:.0f} | | | ends at +{mine[-1]['end'] - runs[0]['start']:.0f} s |")
    lines += ["", f"The {slowest} slowest tests:", "", "| s | session | test | outcome |", "|---|---|---|---|"]
    lines += [f"| {s:.1f} | {name} | {test_id} | {outcome} |" for s, name, test_id, outcome in cases[:slowest]]
    begin = since if since is not None else runs[0]["start"]
    end = time.time() if since is not None else max(r["end"] for r in runs)
    failed = sum(o in ("failure", "error") for *_, o in cases)
    skipped = sum(o == "skipped" for *_, o in cases)
    bad = [r["session"] for r in runs if not r["ok"]]
    lines += ["", f"{len(runs)} sessions, {len(bad)} failed{': ' + ', '.join(bad) if bad else ''}",
              f"tests: {len(cases) - failed - skipped} passed, {failed} failed, {skipped} skipped",
              f"ci wall: {end - begin:.0f} s"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=ROOT / ".nox" / "times")
    parser.add_argument("--since", type=float, help="when the run began (epoch seconds); default: the first "
                        "session's start")
    args = parser.parse_args()
    print(table(args.folder, args.since))
    return 0


if __name__ == "__main__":
    sys.exit(main())
