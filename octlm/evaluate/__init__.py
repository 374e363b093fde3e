"""Scoring a model: validation loss and bits per byte, task accuracy."""
