"""``toolrl view`` in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by
selenium): runs made by the real CLI from ``examples/tiny.yaml`` — two training steps of the tiny model
(its prompts drawn by the ``pass_rate`` curriculum), two rollout steps whose (scripted) model calls the
calculator with ``1/0`` and then ``6*7``, and two evaluations — opened, filtered, compared, and one
growing while the page is open. Screenshots of each view are saved in the test's tmp directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from toolrl_viewer.server import serve

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "examples" / "tiny.yaml"
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
CALL = '<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{}"}}}}\n</tool_call>'


def _script(*turns: str) -> str:
    return "engine.options.script=" + json.dumps(list(turns))


def _toolrl(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "toolrl", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The run directories, made concurrently by the CLI."""
    tmp = tmp_path_factory.mktemp("runs")
    out = {name: tmp / name for name in ("trained", "scripted", "eval-a", "eval-b")}
    scripted = ("engine.name=scripted",)
    jobs = [
        _toolrl("train", str(TINY), "trainer.total_steps=2", f"trainer.output_dir={out['trained']}",
                "data.curriculum={name: pass_rate}"),
        _toolrl("rollout", str(TINY), "trainer.total_steps=2", f"trainer.output_dir={out['scripted']}", *scripted,
                _script(CALL.format("1/0"), CALL.format("6*7"), "The answer is 42.")),
        _toolrl("eval", str(TINY), "eval.num_samples=6", "--output", str(out["eval-a"]), *scripted,
                _script("The answer is 27.")),
        _toolrl("eval", str(TINY), "eval.num_samples=6", "--output", str(out["eval-b"]), *scripted,
                _script(CALL.format("2+2"), "The answer is 4.")),
    ]
    for job in jobs:
        log, _ = job.communicate(timeout=600)
        assert job.returncode == 0, log[-3000:]
    return out


def _chromium(tmp: Path, page_load_strategy: str = "normal"):
    """A headless Chromium whose temporary files (its singleton socket's directory, left behind by
    ``quit``) go under ``tmp``, not /tmp."""
    if not (CHROMIUM and DRIVER):
        if os.environ.get("CI"):
            pytest.fail("the browser tests need Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
        pytest.skip("chromium and chromium-driver are not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    options.page_load_strategy = page_load_strategy
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--no-first-run", "--disable-background-networking"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(DRIVER, env={**os.environ, "TMPDIR": str(tmp)}))


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    driver = _chromium(tmp_path_factory.mktemp("chromium"))
    yield driver
    driver.quit()


class Page:
    """A viewer server on a free port and the browser on its page."""

    def __init__(self, driver, paths: list[Path], shots: Path, held: tuple[str, threading.Event] | None = None) -> None:
        self.server = serve(paths, port=0)
        if held is not None:
            self.server.RequestHandlerClass = _holding(self.server.RequestHandlerClass, *held)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.driver, self.shots = driver, shots
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        driver.get(self.url)

    def open(self, address: str) -> None:
        """The page opened afresh at ``address`` (a hash route), as a link sent by a colleague opens it."""
        self.driver.get("about:blank")
        self.driver.get(self.url + address)

    def js(self, script: str):
        return self.driver.execute_script(script)

    def until(self, script: str, timeout: float = 30.0):
        """The value of ``script`` once it is truthy."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := self.js(script):
                return value
            time.sleep(0.1)
        # What the page showed instead: a trajectory pane's error, the step listed, the page's own errors.
        shown = self.js("""return {trajectory: document.getElementById('trajectory').textContent.slice(0, 300),
            table: window.viewer && window.viewer.tableFor, count: document.getElementById('t-count').textContent,
            errors: window.errors}""")
        raise AssertionError(f"never true within {timeout}s: {script}; the page showed {shown}")

    def points(self, key: str) -> list[int]:
        """Markers drawn per curve in chart ``key`` (read from the SVG plotly rendered)."""
        return self.js(f"""const d = document.getElementById('chart-{key}');
            return d ? [...d.querySelectorAll('.scatterlayer .trace')].map(t => t.querySelectorAll('.points path').length) : null;""")

    def click(self, css: str) -> None:
        self.js(f"document.querySelector({json.dumps(css)}).click()")

    def select(self, css: str, value: str) -> None:
        self.js(f"""const s = document.querySelector({json.dumps(css)}); s.value = {json.dumps(value)};
            s.dispatchEvent(new Event('change'));""")

    def step_table(self, run: Path, run_index: int, step: int) -> list[dict]:
        """The Trajectories tab showing step ``step`` of the ``run_index``-th run (``run``), every row
        listed; that step's rows as written."""
        self.click("#tab-traces")
        self.select("#t-run", str(run_index))
        self.select("#t-source", str(step))
        rows = _rows(run / "rollouts" / f"step_{step:05d}.jsonl")
        # The listing of this step, not another's: every step has as many rows.
        self.until(f"return window.viewer.tableFor === '{run_index}:{step}' && "
                   f"document.getElementById('t-count').textContent.startsWith('{len(rows)} of {len(rows)}')")
        return rows

    def shot(self, name: str) -> None:
        self.driver.save_screenshot(str(self.shots / name))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _holding(handler: type, prefix: str, released: threading.Event) -> type:
    """``handler``, but answering requests whose path starts with ``prefix`` only once ``released`` is set:
    a slow link or a slow disk."""

    class Holding(handler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.startswith(prefix):
                released.wait(120)
            super().do_GET()

    return Holding


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_two_runs_metrics_trajectories_and_a_tool_error(runs, browser, tmp_path):
    page = Page(browser, [runs["trained"], runs["scripted"]], tmp_path)
    try:
        # Both runs' reward curves, one point per step; the trained run's loss too.
        page.until("return window.viewer.firstChart !== null")
        assert page.until("const p = document.querySelectorAll('#chart-reward_mean .scatterlayer .trace');"
                          "return p.length === 2 && [...p].every(t => t.querySelectorAll('.points path').length === 2)")
        assert page.points("reward_mean") == [2, 2]
        assert page.points("tool_call_rate") == [2, 2]
        page.js("document.getElementById('chart-loss').scrollIntoView()")
        page.until("return document.querySelectorAll('#chart-loss .scatterlayer .points path').length === 2")
        page.js("window.scrollTo(0, 0)")
        page.shot("metrics.png")
        # The trained run's curriculum figures come right after the headline charts, before the others.
        order = page.js("return [...document.getElementById('charts').children].map(c => c.dataset.key)")
        drawn = [k for k in order if k.startswith("curriculum/")]
        assert "curriculum/pool/normal" in drawn and order[order.index(drawn[0]):][:len(drawn)] == sorted(drawn)
        assert order.index("grad_norm") < order.index(drawn[0]) and order.index(drawn[-1]) < order.index("advantage_mean")

        # Step 1 of the scripted run, filtered to trajectories with a failed tool call.
        rows = page.step_table(runs["scripted"], run_index=1, step=1)
        page.click("#t-tool_failures")
        failing = [r for r in rows if any(t["status"] != "ok" for t in r["tool_results"])]
        assert failing, "the scripted model's 1/0 must fail"
        page.until(f"return document.getElementById('t-count').textContent.startsWith('{len(failing)} of {len(rows)}')")
        page.click("#t-table tbody tr")
        # The first trajectory opened waits for the tokenizer, loading since the server started.
        page.until("return document.querySelector('#trajectory .tool.error')", timeout=240)
        first = failing[0]
        # The address names the trajectory shown (run, step, trajectory), to be sent to a colleague.
        sent = f"#/run/scripted/step/1/t/{first['trajectory_key'] or first['trajectory_id']}"
        page.until(f"return location.hash === {json.dumps(sent)}")
        tool = page.js("return [...document.querySelectorAll('#trajectory .tool')].map(t => t.textContent)")
        assert any("calculator" in t and "1/0" in t and "division by zero" in t and "error" in t for t in tool), tool
        assert any("6*7" in t and "42" in t and "ok" in t for t in tool), tool
        # The tool's result in the turns as the model saw it, marked as an error; the trained tokens marked.
        turns = page.js("return [...document.querySelectorAll('#trajectory .msg.tool.error')].map(m => m.textContent)")
        assert any("division by zero" in t for t in turns), turns
        trained = page.until("return document.querySelectorAll('#trajectory .tok.trained').length")
        assert trained == sum(first["response_mask"])
        generated = page.js("return [...document.querySelectorAll('#trajectory .msg.generated')].map(m => m.textContent)")
        assert any('"1/0"' in g for g in generated) and any("The answer is 42." in g for g in generated)
        assert page.js("return document.querySelector('#heat option[value=diff]')") is None  # nothing trained
        page.js("document.getElementById('trajectory').scrollIntoView()")
        page.shot("trajectory.png")

        # The trained run has no failing call: the same filter empties its table.
        page.select("#t-run", "0")
        page.select("#t-source", "2")
        page.until("return document.getElementById('t-count').textContent.startsWith('0 of 8')")
        # Its trace rows record the trainer's log-probs: the colouring toggles to trainer − engine, each
        # trained token's tooltip holding the difference.
        page.click("#t-tool_failures")
        page.until("return document.getElementById('t-count').textContent.startsWith('8 of 8')")
        page.click("#t-table tbody tr")
        opened = _rows(runs["trained"] / "rollouts" / "step_00002.jsonl")[0]
        page.until(f"return document.querySelector('#trajectory h3')?.textContent === "
                   f"'trajectory {opened['trajectory_id']}' && document.querySelector('#heat option[value=diff]')")
        page.select("#heat", "diff")
        state = r"""const t = [...document.querySelectorAll('#trajectory .tok.trained')];
            const off = t.filter(s => !(/trainer − engine -?[0-9]/.test(s.title)
                && /^rgba\((30, 90, 230|220, 30, 50), /.test(s.style.background)));
            return {heat: document.getElementById('heat').value, title: document.querySelector('#trajectory h3').textContent,
                    trained: t.length, off: off.slice(0, 3).map(s => [s.title, s.style.background]),
                    notes: [...document.querySelectorAll('#trajectory .legend')].map(n => n.textContent)};"""
        try:
            page.until(f"const s = (() => {{{state}}})(); return s.trained && !s.off.length")
        except AssertionError:
            raise AssertionError(f"trained tokens not coloured by trainer − engine: {page.js(state)}") from None
        assert page.js(state)["trained"] == sum(opened["response_mask"])

        # Back and forward: the step without a trajectory open, then the trajectory again.
        shown = f"#/run/trained/step/2/t/{opened['trajectory_id']}"
        assert page.js("return location.hash") == shown
        page.js("history.back()")
        page.until("return location.hash === '#/run/trained/step/2' && !document.querySelector('#trajectory h3')")
        page.js("history.forward()")
        page.until(f"return document.querySelector('#trajectory h3')?.textContent === 'trajectory {opened['trajectory_id']}'")
        # The address sent opens that trajectory directly: its step's table listed, its row selected.
        page.open(sent)
        page.until(f"return document.querySelector('#trajectory h3')?.textContent === 'trajectory {first['trajectory_id']}'"
                   " && document.querySelector('#trajectory .tool.error')")
        assert page.js("return [document.getElementById('t-run').value, document.getElementById('t-source').value, "
                       "!document.getElementById('traces').classList.contains('hidden'), location.hash]") == [
            "1", "1", True, sent]
        page.until(f"return document.querySelector('#t-table tr.selected')?.dataset.key === '{first['trajectory_id']}'")
    finally:
        page.close()


def test_the_page_works_before_plotly_arrives(runs, tmp_path):
    # A fresh browser (plotly.js not cached) that, like a person, does not wait for the page's load event,
    # which waits for plotly.js.
    driver = _chromium(tmp_path, "eager")
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """window.errors = [];
        addEventListener('error', (e) => errors.push(String(e.message)));
        addEventListener('unhandledrejection', (e) => errors.push(String(e.reason)));"""})
    released = threading.Event()
    page = Page(driver, [runs["trained"], runs["scripted"]], tmp_path, held=("/plotly.min.js", released))
    try:
        # The runs and the metrics' count shown, every chart a placeholder, while plotly.js is held.
        page.until("return window.viewer && typeof window.viewer.firstContent === 'number'")
        assert page.js("return typeof window.Plotly") == "undefined"
        assert page.js("return [...document.querySelectorAll('#runs span')].map(s => s.textContent)") == [
            "trained", "scripted"]
        metrics = page.js("return document.getElementById('metric-count').textContent")
        charts = page.js("return [...document.querySelectorAll('#charts .chart')].map(c => c.textContent)")
        assert metrics == f"{len(charts)} metrics" and len(charts) > 10, (metrics, charts)
        assert set(charts) == {"loading charts…"}
        page.shot("before-plotly.png")

        # A step's table and a trajectory, before plotly.js.
        rows = page.step_table(runs["scripted"], run_index=1, step=1)
        assert page.js("return document.querySelectorAll('#t-table tbody tr').length") == len(rows)
        page.click("#t-table tbody tr")
        page.until("return document.querySelector('#trajectory .tool.error')", timeout=240)
        page.click("#tab-metrics")
        assert page.js("return typeof window.Plotly") == "undefined"

        # plotly.js arrives: the charts are drawn in place of their placeholders.
        released.set()
        page.until("const p = document.querySelectorAll('#chart-reward_mean .scatterlayer .trace');"
                   "return p.length === 2 && [...p].every(t => t.querySelectorAll('.points path').length === 2)")
        assert page.until("return window.viewer.firstChart") > page.js("return window.viewer.firstContent")
        assert page.js("return document.querySelector('#chart-reward_mean .placeholder')") is None
        assert page.js("return window.errors") == []
    finally:
        released.set()
        page.close()
        driver.quit()


def test_another_steps_rows_cannot_be_opened_while_a_step_is_read(runs, browser, tmp_path):
    # Step 1's listing held (a slow disk): step 2's rows, each key step 2's, are not left to be clicked
    # into step 1, where no such trajectory is.
    released = threading.Event()
    page = Page(browser, [runs["trained"], runs["scripted"]], tmp_path,
                held=("/api/traces?run=1&source=1&", released))
    try:
        page.until("return window.viewer && typeof window.viewer.firstContent === 'number'")
        page.step_table(runs["scripted"], run_index=1, step=2)
        page.select("#t-source", "1")
        assert page.js("return [document.querySelectorAll('#t-table tbody tr').length, "
                       "document.getElementById('t-count').textContent]") == [0, "reading the step…"]
        released.set()
        rows = _rows(runs["scripted"] / "rollouts" / "step_00001.jsonl")
        page.until(f"return window.viewer.tableFor === '1:1' && "
                   f"document.querySelector('#t-table tbody tr')?.dataset.key === '{rows[0]['trajectory_id']}'")
        page.click("#t-table tbody tr")
        page.until("return document.querySelector('#trajectory .tool.error')", timeout=240)
    finally:
        released.set()
        page.close()


def test_two_evaluations_side_by_side(runs, browser, tmp_path):
    page = Page(browser, [runs["eval-a"], runs["eval-b"]], tmp_path)
    try:
        page.until("return !document.getElementById('tab-compare').classList.contains('hidden')")
        page.click("#tab-compare")
        page.until("return document.querySelectorAll('#c-problems tbody tr').length === 6")
        summary = page.js("return [...document.querySelectorAll('#c-summary tr')].map(r => r.textContent)")
        assert "A: eval-a" in summary[0] and "B: eval-b" in summary[0]
        calls = next(s for s in summary if s.startswith("tool_calls_per_trajectory"))
        assert calls.endswith("+1"), calls  # B called the calculator once per trajectory, A never
        page.shot("compare.png")
    finally:
        page.close()


def _in_two_pieces(row: dict) -> list[dict]:
    """``row`` as a context policy would have saved it: its first model turn a segment of its own (turns,
    tool results and termination on the last piece), the rest a segment opened by an edit."""
    mask = row["response_mask"]
    cut = mask.index(0)  # the end of the first model turn
    key = row["trajectory_id"]
    edit = {"policy": "drop_tool_outputs", "action": "drop_tool_outputs", "turn": 1, "removed": [2],
            "tokens_before": 120, "tokens_after": 80}
    head = {**row, "trajectory_id": f"{key}~0", "trajectory_key": key, "piece": 0, "turns": 0, "tool_results": [],
            "termination": "forked", "final_response": ""}
    tail = {**row, "trajectory_key": key, "piece": 1, "edit": edit}
    for name in ("response_ids", "response_mask", "logprobs"):
        head[name], tail[name] = row[name][:cut], row[name][cut:]
    return [head, tail]


def test_a_run_being_written_gains_a_step(runs, browser, tmp_path):
    done = runs["scripted"]
    live = tmp_path / "live"
    (live / "rollouts").mkdir(parents=True)
    shutil.copy(done / "config.json", live)
    first, second = (done / "metrics.jsonl").read_text().splitlines(keepends=True)
    (live / "metrics.jsonl").write_text(first)
    # Step 1's first trajectory saved in two segments (a context edit), as one row with both inside.
    step1 = _rows(done / "rollouts" / "step_00001.jsonl")
    split = [*_in_two_pieces(step1[0]), *step1[1:]]
    (live / "rollouts" / "step_00001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in split))
    page = Page(browser, [live], tmp_path)
    try:
        page.until("const p = document.querySelectorAll('#chart-reward_mean .scatterlayer .points path');"
                   "return p.length === 1")
        # The run writes its next step as training does: the step's trajectories, then its metrics line.
        shutil.copy(done / "rollouts" / "step_00002.jsonl", live / "rollouts")
        with (live / "metrics.jsonl").open("a") as f:
            f.write(second)
        page.until("return document.querySelectorAll('#chart-reward_mean .scatterlayer .points path').length === 2",
                   timeout=15)
        page.until("return [...document.getElementById('t-source').options].map(o => o.value).join() === '1,2'")
        page.shot("live.png")

        # The split trajectory's address opens it: one row in its step's table, its two segments in order.
        key = step1[0]["trajectory_id"]
        page.open(f"#/run/live/step/1/t/{key}")
        page.until(f"return document.querySelectorAll('#trajectory section.segment').length === 2 && "
                   f"document.querySelector('#trajectory h3').textContent === 'trajectory {key}'", timeout=240)
        page.until(f"return document.getElementById('t-count').textContent.startsWith('{len(step1)} of {len(step1)} "
                   f"trajectories') && document.getElementById('t-count').textContent.endsWith('{len(split)} segments in all')")
        labels = page.js("return [...document.querySelectorAll('#trajectory .segment-label')].map(h => h.textContent)")
        assert labels[0] == "segment 1 of 2: the start" and labels[1].startswith(
            "segment 2 of 2: opened by drop_tool_outputs: drop_tool_outputs at turn 1"), labels
        assert page.js("return document.querySelectorAll('#trajectory .tok.trained').length") == sum(step1[0]["response_mask"])
        figures = page.js("return Object.fromEntries([...document.querySelectorAll('#trajectory > .meta > span')]"
                          ".map(s => [s.firstChild.textContent, s.lastChild.textContent]))")
        assert (figures["turns"], figures["tool_calls"], figures["segments"]) == (
            str(step1[0]["turns"]), str(len(step1[0]["tool_results"])), "2"), figures
        row = page.js(f"return [...document.querySelector('#t-table tr[data-key=\"{key}\"]').cells].map(c => c.textContent)")
        assert row[1:3] == [key, "2"] and row[7] == str(step1[0]["turns"]), row
        page.js("document.getElementById('trajectory').scrollIntoView()")
        page.shot("segments.png")
    finally:
        page.close()
