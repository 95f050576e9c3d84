"""The Tick family: its template, recognised byte for byte, and the template's history-preserving
twin (the template drops an earlier turn's reasoning; the twin keeps it)."""

from importlib import resources

from toolrl.families import Detection, ModelFamily, Template


def _jinja(name: str) -> Template:
    return Template(jinja=resources.files(__package__).joinpath(name).read_text(encoding="utf-8"))


TICK = ModelFamily(
    name="tick", parser="tick", end_of_turn="<|quad_end|>", special_tokens=("<|quad_start|>", "<|quad_end|>"),
    detection=Detection(templates=(_jinja("tick.jinja"),), markers=("<|quad_start|>", "CALL <name>")),
    training_template=_jinja("tick_training.jinja"))
