"""octlm: train small GPT-style language models with a loop that resumes bit for bit."""

__version__ = "0.1.0"
