"""The prepare stage: files in, a dataset folder of token shards out (`octlm prepare`, with
`--format prompt-completion` for pairs, and `octlm tokenizer train`). It writes what
`octlm.data` reads."""
