"""Synthetic and bundled data sets for training and evaluating the models (no torch)."""
