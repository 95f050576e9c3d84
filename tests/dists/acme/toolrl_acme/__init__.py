"""A model family the core does not know, packaged as a plugin author would: Acme, whose turns are
framed by <|box_start|>/<|box_end|> and whose model writes a call as ``<<call name="f">>{json}<</call>>``.
Its template ships as package data (templates/acme.jinja); ``model.chat_format: acme`` alone selects
its parser and renders with that template. ``acme_next`` is the family's next release, whose new
end-of-turn token older tokenizers lack."""

from toolrl import hookimpl
from toolrl.hookspecs import Register


@hookimpl
def register_tool_parsers(register: Register) -> None:
    register("toolrl_acme.parser:AcmeParser", name="acme")


@hookimpl
def register_model_families(register: Register) -> None:
    register("toolrl_acme.family:ACME", name="acme")
    register("toolrl_acme.family:ACME_NEXT", name="acme_next")
