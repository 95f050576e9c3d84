"""Every change toolrl makes to a torch model, in one layer below the engines and the trainer, which
both take them from here: attention implementations (one table, one installer), LoRA adapters and
their routing per token or row, expert routing recorded or replayed, linears on packed weights, and
weights written as rows. Where a newcomer adds an attention implementation or a model patch:
docs/architecture.md, "Changing the model: the modeling layer"."""
