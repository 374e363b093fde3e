"""The read side of data: a prepared dataset folder (shards, its tokenizer entry), the windows a
run reads from it, and the order it reads them in. `octlm.prepare` writes such folders."""
