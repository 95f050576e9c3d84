"""`toolrl view` on a synthetic run of 1,000 steps × 1,024 trajectories, in headless Chromium.

    OMP_NUM_THREADS=1 python benchmarks/viewer.py [--steps 1000] [--trajectories 1024] [--cold 3] [--repeats 5]

Needs the viewer plugin (plugins/viewer), selenium and Debian's chromium + chromium-driver. Measures, in
the browser (performance.now() from navigation start), for a cold first visit (a fresh browser and
profile: nothing cached, plotly.js compiled from scratch) and for warm reloads:
- first content: the page, the runs and every run's metrics loaded, the metrics summary and the charts'
  placeholders painted (plotly.js loads async: the page does not wait for it);
- first chart: plotly.js run and the first chart painted;
and, on the warm page:
- a step's table: the step's trajectory file indexed (first visit) and its first page shown;
- opening a trajectory: request, read at its offset, per-token decode and render (median over rows;
  the first open, which may wait for the tokenizer to load, is reported apart).
Anchor, side by side: loading the whole step file with json (what a viewer without an index does to
show one trajectory of it). Goals: first content ≤ 2 s cold, opening a trajectory ≤ 0.5 s.

The synthetic run: metrics rows with the keys of a real training step, and one step file of realistic
trajectories (a 300-token prompt; 800 response tokens in 3 model turns and 2 tool results; log-probs,
decoded texts, tool results), hard-linked as every step's file (one file's disk space), plus the Qwen3
tokenizer in checkpoints/hf as training saves it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine, table  # noqa: E402
from toolrl.trajectory import call_prefix, root_id  # noqa: E402


def metrics_row(step: int, rng: random.Random) -> dict:
    reward = min(1.0, step / 1000 + rng.gauss(0, 0.05))
    return {"step": step, "reward_mean": reward, "reward_std": abs(rng.gauss(0.3, 0.05)), "reward_nonfinite": 0,
            "tool_call_count": rng.randint(900, 1500), "tool_success_count": rng.randint(800, 900),
            "tool_call_rate": rng.uniform(1, 1.5), "parse_error_count": rng.randint(0, 20),
            "tool_latency_s": {"calculator": rng.uniform(0.001, 0.01), "search": rng.uniform(0.1, 0.5)},
            "response_length": rng.uniform(600, 900), "model_tokens_mean": rng.uniform(400, 600), "turns_mean": 3.0,
            "terminations": {"answered": 1000, "max_turns": 24}, "template_forks": 0, "template_fork_rate": 0.0,
            "errors": 0, "tool_loop_blocked_s": 0.0, "tool_lifecycle_errors": 0, "prefill_tokens_saved": 250000,
            "rollout_s": rng.uniform(50, 70), "tokens_per_s": rng.uniform(9000, 11000), "groups": list(range(128)),
            "skipped_groups": [], "staleness_mean": 0.5, "staleness_max": 1, "staleness_hist": {"0": 512, "1": 512},
            "loss": rng.gauss(0, 0.01), "grad_norm": rng.uniform(0.1, 1), "loss_tokens": 600000.0,
            "clip_frac": rng.uniform(0, 0.02), "kl": rng.uniform(0, 0.01), "lp_mismatch": rng.uniform(0, 1e-3),
            "is_weight_mean": 1.0, "trained_tokens": 600000.0, "advantage_mean": 0.0, "advantage_std": 0.9,
            "advantage_abs_mean": 0.7, "prefix_share": 0.6, "trainer_tokens_per_s": rng.uniform(20000, 30000),
            "trainer_peak_mb": 40000.0, "weight_sync_s": 1.2, "train_s": 40.0, "step_s": 100.0}


def trajectory(i: int, tok, rng: random.Random) -> dict:
    prompt = [rng.randrange(200, 20000) for _ in range(300)]
    ids, mask = [], []
    for turn in range(5):
        n = 200 if turn % 2 == 0 else 100
        ids += [rng.randrange(200, 20000) for _ in range(n)]
        mask += [1 if turn % 2 == 0 else 0] * n
    failed = i % 7 == 0
    return {"trajectory_id": root_id(call_prefix("t", 1000), i // 8, i // 8, i % 8), "trajectory_key": "", "piece": 0,
            "sample_index": i // 8, "group": i // 8, "env": "arithmetic" if i % 3 else "search",
            "prompt_ids": prompt, "images": [], "response_ids": ids, "response_mask": mask,
            "logprobs": [round(-rng.expovariate(2), 4) if m else 0.0 for m in mask], "turns": 3,
            "final_response": "The answer is 4.",
            "tool_results": [{"name": "calculator", "arguments": {"expression": "2+2"},
                              "response": {"text": "bad expression" if failed and k == 0 else "4", "images": [],
                                           "is_error": failed and k == 0},
                              "status": "error" if failed and k == 0 else "ok", "latency_s": 0.002}
                             for k in range(2)],
            "parse_errors": [], "termination": "answered", "error": None, "reward": rng.random(),
            "reward_terms": {"gsm8k": 1.0}, "reward_errors": {}, "tool_rewards": {}, "tool_errors": {},
            "reward_parts": {}, "user_turns": [], "advantage": rng.gauss(0, 1), "policy_version": 999,
            "prompt_text": tok.decode(prompt), "response_text": tok.decode(ids)}


def build(root: Path, steps: int, trajectories: int) -> Path:
    from toolrl.model_sources import qwen_tokenizer

    rng = random.Random(0)
    tok = qwen_tokenizer("qwen3")
    tok.save_pretrained(root / "checkpoints" / "hf")
    (root / "metrics.jsonl").write_text("".join(json.dumps(metrics_row(s, rng)) + "\n" for s in range(1, steps + 1)))
    rollouts = root / "rollouts"
    rollouts.mkdir()
    first = rollouts / "step_00001.jsonl"
    first.write_text("".join(json.dumps(trajectory(i, tok, rng)) + "\n" for i in range(trajectories)))
    for s in range(2, steps + 1):
        os.link(first, rollouts / f"step_{s:05d}.jsonl")
    return first


def browser(tmp: Path):
    """Headless Chromium, its temporary files (the singleton socket's directory ``quit`` leaves) under ``tmp``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver"),
                                                             env={**os.environ, "TMPDIR": str(tmp)}))


def visit(driver, url: str) -> tuple[float, float]:
    """(first content, first chart) in ms from navigation start, for one page load."""
    driver.get(url)
    chart = until(driver, "return window.viewer && window.viewer.firstChart")
    content = driver.execute_script("return window.viewer.firstContent")
    # 0 bytes: plotly.js came from the browser's cache (a reload within its max-age).
    wire = driver.execute_script("return performance.getEntriesByName(location.origin + '/plotly.min.js')[0].transferSize")
    print("  page marks (ms from navigation):", {k: round(v) for k, v in driver.execute_script(
        "return window.viewer.marks").items()}, f"first content: {content:.0f}, first chart: {chart:.0f}, "
        f"plotly.js over the wire: {wire / 1e6:.1f} MB")
    return content, chart


def until(driver, script: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := driver.execute_script(script)) is not None and value is not False:
            return value
        time.sleep(0.01)
    raise SystemExit(f"timed out: {script}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--trajectories", type=int, default=1024)
    ap.add_argument("--cold", type=int, default=3, help="first visits, each in a fresh browser")
    ap.add_argument("--repeats", type=int, default=5, help="warm reloads (after a cold visit of their own)")
    args = ap.parse_args()
    args.cold, args.repeats = max(args.cold, 1), max(args.repeats, 1)
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        raise SystemExit("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    from toolrl_viewer.server import serve

    root = Path(tempfile.mkdtemp(prefix="toolrl-viewer-bench-"))
    scratch = Path(tempfile.mkdtemp(prefix="toolrl-viewer-bench-chromium-"))
    try:
        t0 = time.perf_counter()
        step_file = build(root, args.steps, args.trajectories)
        print(f"synthetic run: {args.steps} steps × {args.trajectories} trajectories, step file "
              f"{step_file.stat().st_size / 1e6:.1f} MB, built in {time.perf_counter() - t0:.1f} s")
        print(machine())
        server = serve([root], port=0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        cold = []
        for _ in range(args.cold):
            driver = browser(scratch)
            try:
                cold.append(visit(driver, url))
            finally:
                driver.quit()
        driver = browser(scratch)
        warm, table_ms, first_open, opens, full = [], [], None, [], []
        try:
            visit(driver, url)  # cold, in this browser: not counted
            for r in range(args.repeats):
                warm.append(visit(driver, url))
                # A step visited for the first time: its file is indexed, then its first page shown.
                step = str(args.steps - r)
                start = driver.execute_script("return performance.now()")
                driver.execute_script(f"""document.getElementById('tab-traces').click(); const s = document.getElementById('t-source');
                    s.value = '{step}'; s.dispatchEvent(new Event('change'));""")
                until(driver, f"return window.viewer.tableFor === '0:{step}' "
                              "&& document.querySelectorAll('#t-table tbody tr').length === 50")
                table_ms.append(driver.execute_script("return performance.now()") - start)
                for k in range(6):
                    driver.execute_script(f"document.querySelectorAll('#t-table tbody tr')[{k * 7}].click()")
                    ms = until(driver, f"return window.viewer.openedAt && window.viewer.openedAt.row === {k * 7} "
                                       "&& window.viewer.openedAt.ms")
                    if first_open is None:
                        first_open = ms
                    else:
                        opens.append(ms)
                # The anchor: the whole step file loaded to show one trajectory.
                t0 = time.perf_counter()
                with step_file.open() as f:
                    rows = [json.loads(line) for line in f]
                full.append((time.perf_counter() - t0) * 1000)
                del rows
        finally:
            driver.quit()
            server.shutdown()
        med = statistics.median
        cold_content, cold_chart = [c for c, _ in cold], [c for _, c in cold]
        warm_content, warm_chart = [c for c, _ in warm], [c for _, c in warm]
        print(table(["measure", "median ms", "min ms", "goal ms", "× goal"], [
            [f"first content, cold first visit ({args.steps} steps of metrics)", med(cold_content),
             min(cold_content), 2000, med(cold_content) / 2000],
            ["first chart, cold first visit (plotly.js compiled)", med(cold_chart), min(cold_chart), 2000,
             med(cold_chart) / 2000],
            ["first content, warm reloads", med(warm_content), min(warm_content), 2000, med(warm_content) / 2000],
            ["first chart, warm reloads", med(warm_chart), min(warm_chart), 2000, med(warm_chart) / 2000],
            [f"a step's table, first visit (index {args.trajectories} rows)", med(table_ms), min(table_ms), "", ""],
            ["open a trajectory (after the first)", med(opens), min(opens), 500, med(opens) / 500],
            ["open the first trajectory (tokenizer may load)", first_open, first_open, "", ""],
            ["anchor: json-load the whole step file", med(full), min(full), "", ""],
        ]))
        print(f"open a trajectory / anchor: {med(opens) / med(full):.3f}×")
        for name, ms in (("first content, cold", med(cold_content)), ("first chart, cold", med(cold_chart)),
                         ("open a trajectory", med(opens))):
            goal = 500 if name == "open a trajectory" else 2000
            print(f"{name}: {ms:.0f} ms, goal ≤ {goal} ms: {'met' if ms <= goal else 'NOT MET'}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
