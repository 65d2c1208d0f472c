"""Training: losses, optimiser and schedules, checkpoints, the loop."""
