"""Every change toolrl makes to a torch model, in one layer below the engines and the trainer, which both
take them from here: attention implementations (one table, one installer), LoRA adapters and their
routing, expert routing recorded or replayed, linears on packed weights. Where a newcomer adds an
attention implementation or a model patch: docs/architecture.md, "Changing the model"."""
