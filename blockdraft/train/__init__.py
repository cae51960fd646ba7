"""Training a DFlash draft: target-regenerated data, the block objective, the trainer (docs/training.md)."""
