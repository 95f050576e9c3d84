"""Overrides on the command line: applied in order (the last of a key wins, as errors then name it), and
``env=OTHER`` drops the file's env_options (written for the file's env)."""

from pathlib import Path

from toolrl.config import load_config

TINY = Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml"


def test_another_env_drops_the_files_options():
    assert load_config(TINY).env_options == {"train_size": 64, "test_size": 16, "seed": 0}
    assert load_config(TINY, ["env=geo3k"]).env_options == {}
    assert load_config(TINY, ["env=arithmetic"]).env_options["train_size"] == 64
    assert load_config(TINY, ["env=geo3k", "env_options.hub_id=x"]).env_options["hub_id"] == "x"


def test_the_last_override_of_a_key_wins():
    assert load_config(TINY, ["rollout.n=2", "rollout.n=3"]).rollout.n == 3
    assert load_config(TINY, ["rollout={n: 2}", "rollout.n=3"]).rollout.n == 3
