"""``toolrl eval`` and ``toolrl train`` on tau2-mock with the tiny random Qwen3 of examples/tiny.yaml:
the evaluation's summary holds τ²'s reward, and a training step runs."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner
from toolrl.cli import cli

TINY = Path(__file__).resolve().parents[3] / "examples" / "tiny.yaml"


def toolrl(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_eval_writes_tau2_reward(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    result = toolrl("eval", str(TINY), "env=tau2-mock", "eval.num_samples=4", "--output", str(out))
    assert result.exit_code == 0, result.output + (result.stderr if result.stderr_bytes else "")
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert summary["num_samples"] == 4 and len(rows) == 4 * summary["n"]
    # The reward is τ²'s: the session's score, with its parts beside it in every row.
    for row in rows:
        assert row["reward"] == row["reward_terms"]["tau2"] and set(row["reward_terms"]) == {"tau2"}
        assert "tau2.nl_assertions_skipped" in row["reward_parts"]
    assert summary["reward_mean"] == statistics.fmean(r["reward"] for r in rows)


def test_train_one_step(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = toolrl("train", str(TINY), "env=tau2-mock", "trainer.total_steps=1", f"trainer.output_dir={out}")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "rollouts" / "step_00001.jsonl").read_text().splitlines()]
    assert rows and all("reward_parts" in r for r in rows)


def test_listing_and_a_domains_prompt_import_neither_the_registry_nor_litellm() -> None:
    """``toolrl env list`` builds each τ² environment's policy and counts its tasks; through ``tau2.registry``
    that imported τ²'s agents and litellm, 6 s of CPU a listing (a fresh process: other tests import them)."""
    code = ("import json, sys; from toolrl.cli import cli; "
            "cli(['env', 'list', '--json'], standalone_mode=False); "
            "print('imported:', json.dumps([m for m in ('litellm', 'tau2.registry', 'tau2.agent') if m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    listing, _, imported = done.stdout.rpartition("imported: ")
    assert {r["name"]: r for r in json.loads(listing)}["tau2-airline"]["splits"]["train"]["size"] > 0
    assert json.loads(imported) == []
