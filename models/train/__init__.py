"""Training entry points: ``train(kind, ...)`` dispatches to one small trainer per model."""
