"""The ledger's ``read_page`` tool passes toolrl.testing's tool conformance kit: it resolves through
the registry, declares a valid schema, runs its lifecycle per trajectory, answers bad input with an
error naming the field, keeps ledgers apart and survives many concurrent trajectories."""

from toolrl.testing import ToolConformance
from toolrl_ledger.pages import audit_key


class TestReadPageConformance(ToolConformance):
    tool_name = "read_page"
    tool_config = {"type": "native"}
    valid_arguments = {"n": 1}
    invalid_arguments = [{"n": "one"}, {"n": 0}, {"n": 5}]  # page 5: past the ledger
    create_kwargs = {"seed": 7, "pages": 4, "rows": 3}
    other_create_kwargs = {"seed": 8, "pages": 4, "rows": 3}  # another ledger: another audit key on page 1
    expected_text = f"The audit key is {audit_key(7)};"
