"""Data: documents in, token shards and in-memory blocks out."""
