"""The network: the decoder, positions, the key/value cache, the Hugging Face mapping."""
