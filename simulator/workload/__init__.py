"""What the model costs: per-kernel compute, memory per GPU, per-stage work and message sizes."""
