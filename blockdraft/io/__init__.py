"""Reading and writing draft checkpoints and loading targets."""
