"""Reinforcement learning on verifiable tasks (`octlm rl`)."""
