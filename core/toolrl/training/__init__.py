"""Training: the policy step (any estimator and loss), packed batches, log-probs, the critic, LoRA, FSDP2
sharding, weight syncs, the trained model's builder and checkpoint export."""
