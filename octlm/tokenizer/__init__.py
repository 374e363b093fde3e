"""The tokenizer: one concept, one room (docs/architecture.md).

`core.py` (`Tokenizer`, `Specials`, train, load, save), `hf_folder.py` (`open_tokenizer`: a
tokenizer.json or a Hugging Face folder, with the BOS/EOS/PAD its config files give),
`token_bytes.py` (bytes per token id, for bits per byte) and `fastbpe.py` (the exact fast
encoder of `octlm prepare`). Import from those modules: this file re-exports nothing.
"""
