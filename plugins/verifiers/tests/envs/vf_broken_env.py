"""An environment package whose ``load_environment`` fails (a missing data file, say)."""


def load_environment(**kwargs):
    raise FileNotFoundError("adder.jsonl: no such file\n(while reading the rows)")
