"""The training loop and everything a resume restores."""
