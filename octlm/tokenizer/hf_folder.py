"""`--tokenizer PATH`: a tokenizer.json, or a Hugging Face folder holding one, with its specials.

A tokenizer.json says which tokens are special but not which is BOS, EOS or PAD; its folder's
config files do. Each role is taken from the first of these that names it:

1. `special_tokens_map.json` (`bos_token`, ...: a string or {"content": ...});
2. `tokenizer_config.json` (the same keys; transformers merges file 1 over this one);
3. `config.json` (`bos_token_id`, `eos_token_id`, `pad_token_id`);
4. `generation_config.json` (the same keys);
5. octlm's own `<|bos|>`, `<|eos|>`, `<|pad|>`, if the tokenizer holds them.

The tokenizer files come first because they are what `AutoTokenizer.from_pretrained(DIR)` uses,
so octlm's ids are transformers'; the model's config files only fill a gap. Then:

- EOS is required (documents are separated by it): none is a one-line error;
- BOS: documents start with it exactly when transformers would add it: `add_bos_token` in
  tokenizer_config.json when it is there (transformers then rewrites the post-processor to
  match), else whether tokenizer.json's post-processor puts BOS first (transformers 5 writes
  no `add_bos_token`, only the post-processor). Otherwise documents start with no BOS, and the
  previous document's EOS is what separates them, as in GPT-2's data. `add_eos_token` is not
  read: octlm always ends a document with EOS;
- PAD absent (Llama has none): EOS is the pad input id; padded targets are masked by position.

A tokenizer holding octlm's three special tokens is octlm's own: those ids, whatever files sit
beside it (an `octlm export` folder's tokenizer_config.json says `add_bos_token: false` for
transformers' sake, while octlm's documents start with `<|bos|>`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tokenizers

from octlm.errors import TokenizerError
from octlm.fsutil import read_json_object
from octlm.hashing import file_sha256
from octlm.tokenizer.core import (
    SPECIAL_TOKENS,
    Specials,
    Tokenizer,
    octlm_specials,
    read_tokenizer_json,
)

TOKENIZER_JSON = "tokenizer.json"
CONFIG_FILES = (
    "special_tokens_map.json",
    "tokenizer_config.json",
    "config.json",
    "generation_config.json",
)
ROLES = ("bos", "eos", "pad")


def tokenizer_json(path: Path) -> Path:
    """`path` itself, or the tokenizer.json inside the folder `path`."""
    if path.is_dir():
        inner = path / TOKENIZER_JSON
        if not inner.is_file():
            raise TokenizerError(
                f"{path} holds no {TOKENIZER_JSON}",
                "pass a Hugging Face folder with a fast tokenizer (tokenizer.json), or the "
                "file itself",
            )
        return inner
    if not path.is_file():
        raise TokenizerError(f"tokenizer file not found: {path}", "check the path")
    return path


def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _id_value(value: Any) -> int | None:
    if isinstance(value, list):  # e.g. Llama 3's [128001, 128008, 128009]: the first is the
        value = value[0] if value else None  # end of text, the others end chat turns
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _role_id(
    role: str, configs: dict[str, dict[str, Any]], hf: tokenizers.Tokenizer, folder: Path
) -> int | None:
    for name in CONFIG_FILES:
        config = configs.get(name)
        if config is None:
            continue
        if name.startswith(("special_tokens_map", "tokenizer_config")):
            token = _token_content(config.get(f"{role}_token"))
            if token is None:
                continue
            idx = hf.token_to_id(token)
            if idx is None:
                raise TokenizerError(
                    f"{folder / name} names {role}_token {token!r}, which {TOKENIZER_JSON} "
                    "does not hold",
                    f"fix {role}_token in {name}",
                )
            return idx
        idx = _id_value(config.get(f"{role}_token_id"))
        if idx is not None:
            return idx
    return hf.token_to_id(SPECIAL_TOKENS[ROLES.index(role)])


def _post_processor_adds(hf: tokenizers.Tokenizer, bos: int) -> bool:
    """Whether tokenizer.json's post-processor starts a single text with token `bos`."""
    token = hf.id_to_token(bos)
    post = json.loads(hf.to_str()).get("post_processor") or {}
    for proc in post.get("processors", [post]):  # a Sequence, or the processor itself
        if proc.get("type") == "TemplateProcessing":
            first = (proc.get("single") or [{}])[0]
            return (first.get("SpecialToken") or {}).get("id") == token
        if proc.get("type") in ("BertProcessing", "RobertaProcessing"):
            return (proc.get("cls") or [None])[0] == token
    return False


def resolve_specials(hf: tokenizers.Tokenizer, file: Path) -> Specials | None:
    """The specials the config files beside `file` give `hf` (module docstring); None: octlm's
    own."""
    folder = file.parent
    if octlm_specials(hf) is not None:
        return None  # octlm's own, whatever the folder says (see the module docstring)
    files = [name for name in CONFIG_FILES if (folder / name).is_file()]
    configs = {
        name: read_json_object(folder / name, TokenizerError, "fix or remove it") for name in files
    }
    bos, eos, pad = (_role_id(role, configs, hf, folder) for role in ROLES)
    if eos is None:
        raise TokenizerError(
            f"no EOS token for {file} (looked in {', '.join(CONFIG_FILES)})",
            'name it in tokenizer_config.json, e.g. "eos_token": "</s>"',
        )
    add_bos = configs.get("tokenizer_config.json", {}).get("add_bos_token")
    if bos is not None and not (
        add_bos if isinstance(add_bos, bool) else _post_processor_adds(hf, bos)
    ):
        bos = None
    return Specials(bos=bos, eos=eos, pad=eos if pad is None else pad)


def open_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer a path names (`--tokenizer PATH`): a tokenizer.json or a folder holding one,
    with the specials its folder gives it (module docstring). A prepared dataset's own file takes
    the ids its manifest records instead: `octlm.data.dataset_tokenizer.tokenizer_at`."""
    file = tokenizer_json(Path(path))
    hf = read_tokenizer_json(file)
    return Tokenizer(hf, file_sha256(file), resolve_specials(hf, file))
