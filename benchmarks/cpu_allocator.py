"""CPU training runs with torch's large CPU allocations on transparent huge pages, against its default.

    OMP_NUM_THREADS=1 python benchmarks/cpu_allocator.py [--steps 3] [--repeats 2] [--configs examples/tiny.yaml ...]

Each run is ``toolrl train CONFIG`` for ``--steps`` steps in a fresh process, with ``THP_MEM_ALLOC_ENABLE=0``
(the anchor: torch's default, every allocation's pages faulted in 4 kB at a time) or ``=1`` (allocations of
2 MB and more aligned to 2 MB and advised as huge pages). The arms alternate, ``--repeats`` times each, so
machine load falls on both alike. A run's CPU is its process tree's user + system seconds (``RUSAGE_CHILDREN``
of this script), its page faults the minor faults. Every run is printed, then per config the median of each
arm and the ratio thp/default of CPU seconds and wall time, with the spread over the pairs. The THP setting of
the machine (``/sys/kernel/mm/transparent_hugepage/enabled``) must be ``madvise`` or ``always`` for the second
arm to differ; the script prints it. Last line: ``cpu s, thp/default: X.XX`` (the first config's median ratio).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine, table

ROOT = Path(__file__).resolve().parent.parent
ARMS = {"default": "0", "thp": "1"}


def run(config: str, steps: int, thp: str) -> dict[str, float]:
    """One ``toolrl train`` run; its tree's CPU seconds, minor faults and wall seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "toolrl", "train", config, f"trainer.total_steps={steps}",
                        f"trainer.output_dir={out}/run", "trainer.plot=false", "trainer.progress=false"],
                       env={**os.environ, "OMP_NUM_THREADS": "1", "THP_MEM_ALLOC_ENABLE": thp}, cwd=ROOT,
                       check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
            "sys_s": after.ru_stime - before.ru_stime, "minflt": after.ru_minflt - before.ru_minflt, "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="+", default=["examples/tiny.yaml", "examples/quickstart.yaml"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    thp_setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    print(machine(), "| THP:", thp_setting.read_text().strip() if thp_setting.exists() else "n/a", flush=True)
    first_ratio = None
    for config in args.configs:
        results: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
        rows = []
        for repeat in range(args.repeats):
            for arm, value in ARMS.items():
                r = run(config, args.steps, value)
                results[arm].append(r)
                rows.append([config, repeat + 1, arm, f"{r['cpu_s']:.1f}", f"{r['sys_s']:.1f}",
                             f"{r['minflt'] / 1e6:.2f}", f"{r['wall_s']:.1f}"])
                print(" ".join(map(str, rows[-1])), flush=True)
        print(table(["config", "repeat", "arm", "cpu s", "sys s", "faults M", "wall s"], rows))
        cpu = [t["cpu_s"] / d["cpu_s"] for d, t in zip(results["default"], results["thp"], strict=True)]
        wall = [t["wall_s"] / d["wall_s"] for d, t in zip(results["default"], results["thp"], strict=True)]
        med = {arm: statistics.median(r["cpu_s"] for r in rs) for arm, rs in results.items()}
        print(f"{config}: cpu s default {med['default']:.1f}, thp {med['thp']:.1f}; thp/default per pair: cpu "
              f"{', '.join(f'{c:.2f}' for c in cpu)}; wall {', '.join(f'{w:.2f}' for w in wall)}")
        first_ratio = first_ratio if first_ratio is not None else statistics.median(cpu)
    print(f"cpu s, thp/default: {first_ratio:.2f}")


if __name__ == "__main__":
    main()
