"""Training: the GRPO step, packed batches, log-probs, LoRA, FSDP2 sharding, checkpoints and weight syncs."""
