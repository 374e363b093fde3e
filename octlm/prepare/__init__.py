"""The prepare stage: files in, a dataset folder of token shards out (`octlm prepare`,
`octlm prepare-pairs`, `octlm tokenizer train`). Reads text; writes what `octlm.data` reads."""
