"""``env=OTHER`` on the command line drops the file's env_options (written for the file's env)."""

from pathlib import Path

from toolrl.config import load_config

TINY = Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml"


def test_another_env_drops_the_files_options():
    assert load_config(TINY).env_options == {"train_size": 64, "test_size": 16, "seed": 0}
    assert load_config(TINY, ["env=geo3k"]).env_options == {}
    assert load_config(TINY, ["env=arithmetic"]).env_options["train_size"] == 64
    assert load_config(TINY, ["env=geo3k", "env_options.hub_id=x"]).env_options["hub_id"] == "x"
