"""Generation: sampling from a trained model, chat, and the run opened for use."""
