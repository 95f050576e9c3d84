"""The Acme family; its template is package data, read when a run first renders with it."""

from toolrl.families import Detection, ModelFamily, Template

ACME = ModelFamily(
    name="acme", parser="acme", end_of_turn="<|box_end|>", special_tokens=("<|box_start|>", "<|box_end|>"),
    template=Template(resource="toolrl_acme:templates/acme.jinja"),
    detection=Detection(markers=("<|box_start|>", "<<call name=")))
ACME_NEXT = ACME.model_copy(update={"name": "acme_next", "end_of_turn": "<|acme_turn_end|>",
                                    "detection": Detection()})
