"""Reinforcement learning on verifiable tasks: `octlm rl`, after the chat fine-tune."""
