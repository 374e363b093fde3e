"""`--init-from`: the weights and shape a new run starts from, read safely.

A source is an octlm run folder, checkpoint or snapshot file, or a Hugging Face LlamaForCausalLM
or Qwen3ForCausalLM folder (config.json + safetensors, as `octlm export` writes; Qwen3's per-head
q/k norms are octlm's qk_norm). Only safetensors are read, so nothing in a source can run code:
pickle files (.bin, .pt, ...) are refused unopened. The source decides the model's shape; the
run decides its context (at most the source's) and dropout, and its data must use the source's
tokenizer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from octlm.config.shape import PRESETS, SHAPE_KEYS, ModelConfig
from octlm.config.train import TrainConfig
from octlm.errors import OctlmError
from octlm.fsutil import read_json_object
from octlm.hashing import checksum_matches, file_sha256, weights_sha256
from octlm.model.gpt import GPT
from octlm.model.hf import layers_held, model_config_from_hf, octlm_state_dict
from octlm.runlog.reader import LOG_NAME
from octlm.tokenizer.core import Tokenizer
from octlm.trainer import checkpoint as ckpt

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
HF_CONFIG, HF_WEIGHTS, HF_INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"
FIX_JSON = "fix or replace it"
FIX_SOURCE = (
    "name an octlm run folder or checkpoint, or a LlamaForCausalLM or Qwen3ForCausalLM folder"
)
FIX_PICKLE = (
    "convert it to safetensors: load it with transformers and save_pretrained(OUT) (the default "
    "since transformers 4.35; before it, pass safe_serialization=True)"
)
FIX_FIT = "name a source whose config matches its weights"
# The fields a preset or a shape flag sets: with --init-from they must agree with the source.
SHAPE_FIELDS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "rope_base", "norm_eps")
SHAPE_FIELDS += ("init_std",)


class InitFromError(OctlmError):
    """An --init-from source that cannot be read, or does not fit the run."""


@dataclass(frozen=True)
class InitSource:
    shape: dict[str, Any]
    """The source's ModelConfig fields (its own vocab_size and context)."""
    weights: dict[str, torch.Tensor]
    """float32, under octlm's names."""
    record: dict[str, Any]
    """Its identity for the log header and the checkpoints: path, kind, weights_sha256, ..."""


def _refuse_pickle(path: Path) -> None:
    if path.suffix in PICKLE_SUFFIXES:
        raise InitFromError(
            f"{path} is a pickle file: octlm never unpickles (it could run code)", FIX_PICKLE
        )


def _refuse_pickles(folder: Path) -> None:
    """A folder whose weights are pickles (pytorch_model.bin, ...): say why none is read."""
    for other in sorted(folder.iterdir()):
        _refuse_pickle(other)


def _has_octlm_header(path: Path) -> bool:
    """Whether a safetensors file carries octlm's metadata (an unreadable one: left to the
    checkpoint reader, which names what is wrong with it)."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return "octlm" in (f.metadata() or {})
    except Exception:  # safetensors raises its own error types for bad headers
        return True


def _read_safetensors(files: list[Path]) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        if not path.is_file():
            raise InitFromError(f"{path} is missing", "name a complete LlamaForCausalLM folder")
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                names = list(f.keys())
                twice = sorted(set(names) & set(tensors))
                if not twice:
                    tensors.update({name: f.get_tensor(name) for name in names})
        except Exception as exc:  # safetensors raises its own error types for bad headers
            raise InitFromError(f"{path} is not a readable safetensors file ({exc})") from None
        if twice:
            raise InitFromError(f"{path} holds {twice[0]} again (another shard has it)", FIX_FIT)
    return tensors


def _shard_files(folder: Path) -> list[Path]:
    """The shards a model.safetensors.index.json names: files in the folder itself."""
    index = read_json_object(folder / HF_INDEX, InitFromError, FIX_JSON)
    weight_map = index.get("weight_map")
    names = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else []
    if not names or not all(isinstance(n, str) and n and Path(n).name == n for n in names):
        raise InitFromError(
            f"{folder / HF_INDEX}: weight_map must map tensor names to shard files in its folder",
            FIX_JSON,
        )
    return [folder / name for name in names]


def _read_hf(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any]]:
    shape = model_config_from_hf(read_json_object(folder / HF_CONFIG, InitFromError, FIX_JSON))
    if (folder / HF_WEIGHTS).is_file():
        files = [folder / HF_WEIGHTS]
    elif (folder / HF_INDEX).is_file():
        files = _shard_files(folder)
    else:
        _refuse_pickles(folder)  # pytorch_model.bin: say why it is not read
        raise InitFromError(f"{folder} holds no {HF_WEIGHTS}", "save the model as safetensors")
    weights = octlm_state_dict(_read_safetensors(files), shape["n_layers"], shape["qk_norm"])
    tok = folder / "tokenizer.json"
    tokenizer = file_sha256(tok) if tok.is_file() else None
    return shape, weights, {"kind": "hf", "file": str(files[0].resolve()), "tokenizer": tokenizer}


def _read_octlm(
    source: str, target: Path
) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any]]:
    try:  # a run folder's newest checkpoint, as its checkpoints/latest.json lists it
        path, checksum = ckpt.find_checkpoint(target)
    except ckpt.CheckpointError as exc:  # none listed, or the list is damaged
        raise InitFromError(
            exc.problem,
            "name a checkpoint file of the run (checkpoints/step_*.safetensors), or a run "
            "folder that has written one",
        ) from None
    if checksum is not None and path.is_file() and not checksum_matches(path, checksum):
        raise InitFromError(
            f"--init-from {source}: checkpoint {path.name} fails its checksum (it is damaged)",
            "name another checkpoint of the run (checkpoints/step_*.safetensors) or an intact copy",
        )
    info, tensors = ckpt.load_checkpoint(path, None)  # the checksum: just checked
    if info.model_config is None:
        raise InitFromError(f"{path} holds no model config", "name an octlm checkpoint")
    shape = dict(info.model_config)
    record = {
        "kind": "octlm",
        "file": str(path.resolve()),
        "tokenizer": info.fingerprints.get("tokenizer"),
        "step": info.step,
    }
    return shape, ckpt.model_weights(tensors), record


def _locate(source: str, path: Path) -> tuple[bool, Path]:
    """(whether it is a Hugging Face folder, the folder or file to read) for an existing path;
    a folder that is neither kind is refused, naming what it holds instead."""
    if path.is_file():
        if path.name in (HF_CONFIG, HF_INDEX, HF_WEIGHTS) and (path.parent / HF_CONFIG).is_file():
            return True, path.parent  # a Hugging Face folder named by one of its files
        if path.suffix == ".safetensors" and not _has_octlm_header(path):
            raise InitFromError(
                f"--init-from {source} is a safetensors file without octlm's header",
                f"name its folder, with the model's {HF_CONFIG} beside it (a LlamaForCausalLM "
                "folder), or an octlm checkpoint",
            )
        return False, path
    if (path / HF_CONFIG).is_file():
        return True, path
    if (path / ckpt.CKPT_DIR).is_dir() or (path / LOG_NAME).is_file():
        return False, path  # a run folder: its newest checkpoint
    if (path / HF_WEIGHTS).is_file() and _has_octlm_header(path / HF_WEIGHTS):
        return False, path / HF_WEIGHTS  # as `octlm export --format safetensors` writes it
    if (path / HF_WEIGHTS).is_file() or (path / HF_INDEX).is_file():
        raise InitFromError(
            f"--init-from {source} holds Hugging Face weights but no {HF_CONFIG}",
            f"copy the model's {HF_CONFIG} beside them",
        )
    _refuse_pickles(path)
    raise InitFromError(
        f"--init-from {source} holds no checkpoints/ (an octlm run) and no {HF_CONFIG} (a "
        "Hugging Face model)",
        FIX_SOURCE,
    )


def read_source(source: str) -> InitSource:
    """The source's shape, float32 weights under octlm's names, and identity record: checked
    to fit each other before any model is built."""
    path = Path(source)
    if not source.strip():
        raise InitFromError("--init-from is empty", FIX_SOURCE)
    if not path.exists():
        raise InitFromError(f"--init-from {source} does not exist", FIX_SOURCE)
    _refuse_pickle(path)
    is_hf, path = _locate(source, path)
    shape, weights, record = _read_hf(path) if is_hf else _read_octlm(source, path)
    bad = sorted(n for n, t in weights.items() if not t.is_floating_point())
    if bad:
        raise InitFromError(f"{source}: tensor {bad[0]} is not floating point")
    check_fit(source, shape, weights)
    # Every field, options a source predates included at their default (off): what it built.
    shape = ModelConfig.from_dict(shape).to_dict()
    # Weights train in float32 (autocast or not): a bf16/fp16 source widens exactly.
    weights = {name: t.to(torch.float32) for name, t in weights.items()}
    record = {"path": source, **record, "weights_sha256": weights_sha256(weights)}
    return InitSource(shape=shape, weights=weights, record=record)


@dataclass(frozen=True)
class InitPlan:
    model_config: ModelConfig
    weights: dict[str, torch.Tensor] | None
    """None when resuming: the checkpoint's weights win, the source is not read again."""
    record: dict[str, Any] | None
    notes: list[str]


def plan_init(
    cfg: TrainConfig,
    tokenizer: Tokenizer,
    resumed: ckpt.CheckpointInfo | None,
    model_flag: bool = False,
) -> InitPlan | None:
    """What --init-from gives the run (None without it). A resume takes the shape and the
    source's record from the checkpoint it loads (`resumed`), so a source moved or changed
    since cannot change a resumed run, and the run resumes bit-exactly. `model_flag`: `--model`
    was typed for this run, and must have the shape it starts from (`check_preset_shape`)."""
    if cfg.run.init_from is None:
        return None
    if resumed is not None and resumed.model_config is not None:
        if model_flag:
            check_preset_shape(cfg, resumed.model_config)
        note = f"--resume found a checkpoint: it wins, --init-from {cfg.run.init_from} is not read"
        model_config = model_config_for(resumed.model_config, cfg, tokenizer)
        return InitPlan(model_config, None, resumed.init_from, [note])
    source = read_source(cfg.run.init_from)
    if model_flag:
        check_preset_shape(cfg, source.shape)
    check_shape_keys(cfg, source.shape)
    model_config = model_config_for(source.shape, cfg, tokenizer)  # the vocabulary first
    check_tokenizer(source.record, tokenizer)
    return InitPlan(model_config, source.weights, source.record, [])


def check_shape_keys(cfg: TrainConfig, shape: dict[str, Any]) -> None:
    """Shape keys a config sets (`--d-model`, ...) must agree with the source's: the source
    decides the shape. Keys equal to it pass, so a `--print-config` file of the run is fine."""
    given = {k: getattr(cfg.shape, k) for k in SHAPE_KEYS if getattr(cfg.shape, k) is not None}
    wrong = [f"{k} {v} vs the source's {shape[k]}" for k, v in given.items() if v != shape[k]]
    if wrong:
        raise InitFromError(
            f"--init-from {cfg.run.init_from} has another shape: {', '.join(wrong)}",
            "drop those keys: the source decides the model's shape",
        )


def check_preset(cfg: TrainConfig, model_flag: str | None) -> None:
    """`octlm sweep` and `verify-resume` with --init-from: the source is read here, before any
    run starts (one that cannot be read is one line, not a failed run per setting, each naming
    the config file the tool wrote). Their runs read that file, whose preset yields to the
    source, so a `--model` flag is checked here too, against the source (`octlm train` checks
    it in the run: `plan_init`)."""
    if cfg.run.init_from is not None:
        shape = read_source(cfg.run.init_from).shape
        if model_flag is not None:
            check_preset_shape(cfg, shape)


def check_preset_shape(cfg: TrainConfig, shape: dict[str, Any]) -> None:
    """A `--model` flag given with --init-from must have the shape the run starts from, the
    source's or the resumed checkpoint's (vocabulary and context aside: the data and --context
    decide those). A preset from a config file yields to the source: a config (a shipped one, or
    the file a tool writes for its runs) sets a preset along with everything else, and its other
    settings are what the user wants; only a flag typed for this run is a statement about this
    run's shape."""
    preset = PRESETS[cfg.shape.model].to_dict()
    wrong = [f"{k} {shape.get(k)} vs {preset[k]}" for k in SHAPE_FIELDS if shape[k] != preset[k]]
    if wrong:
        raise InitFromError(
            f"--model {cfg.shape.model} contradicts --init-from {cfg.run.init_from}: "
            f"{', '.join(wrong)}",
            "the source decides the model's shape: drop --model",
        )


def model_config_for(shape: dict[str, Any], cfg: TrainConfig, tokenizer: Tokenizer) -> ModelConfig:
    """The run's model: the source's shape, the run's context and dropout; refused when the
    data's vocabulary is not the source's or the context is longer than the source's."""
    if shape["vocab_size"] != tokenizer.vocab_size:
        raise InitFromError(
            f"--init-from {cfg.run.init_from} has a vocabulary of {shape['vocab_size']} tokens, "
            f"the data's tokenizer {tokenizer.vocab_size}",
            "pass --data prepared with the source's tokenizer (on the embedded corpus: the "
            "source's --model)",
        )
    if cfg.inputs.context > shape["context"]:
        raise InitFromError(
            f"context {cfg.inputs.context} exceeds --init-from {cfg.run.init_from}'s "
            f"{shape['context']}",
            f"use --context {shape['context']} or less",
        )
    try:
        return ModelConfig.from_dict(
            {**shape, "context": cfg.inputs.context, "dropout": cfg.shape.dropout}
        )
    except ValueError as exc:
        raise InitFromError(f"--init-from {cfg.run.init_from}: {exc}") from None


def check_tokenizer(record: dict[str, Any], tokenizer: Tokenizer) -> None:
    """The data's tokenizer must be the one the source recorded (when it records one)."""
    theirs = record.get("tokenizer")
    if theirs is not None and theirs != tokenizer.fingerprint:
        raise InitFromError(
            f"the data's tokenizer ({tokenizer.fingerprint[:12]}) is not --init-from "
            f"{record['path']}'s ({theirs[:12]})",
            "prepare the data with the source's tokenizer.json",
        )


def check_fit(source: str, shape: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
    """The source's config must be a model octlm can build, and its weights that model's (names
    and shapes): checked on a model without storage, so no size in a config is allocated."""
    try:
        config = ModelConfig.from_dict(shape)
    except (TypeError, ValueError) as exc:
        raise InitFromError(f"--init-from {source}: its model config is invalid ({exc})") from None
    held = layers_held(weights, "layers.")
    if held != config.n_layers:  # before a model of n_layers blocks is built
        raise InitFromError(
            f"--init-from {source}: its config has {config.n_layers} layers, its weights {held}",
            FIX_FIT,
        )
    try:  # on "meta" it draws no random numbers: a fresh run's generators stay as they are
        with torch.device("meta"):
            own = GPT(dataclasses.replace(config, context=1)).state_dict()
    except RuntimeError as exc:  # a size past int64 ("Storage size calculation overflowed")
        raise InitFromError(
            f"--init-from {source}: its config's sizes fit no model ({exc})"
        ) from None
    _check_names_and_shapes(source, own, weights)


def _check_names_and_shapes(
    source: str, own: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]
) -> None:
    for name, tensor in weights.items():
        if name in own and own[name].shape != tensor.shape:
            raise InitFromError(
                f"--init-from {source}: {name} has shape {tuple(tensor.shape)}, the model "
                f"{tuple(own[name].shape)}",
                FIX_FIT,
            )
    if set(weights) != set(own):
        missing, extra = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
        raise InitFromError(f"--init-from {source}: missing {missing[:3]}, extra {extra[:3]}")


def load_into(model: GPT, weights: dict[str, torch.Tensor], source: str) -> None:
    """Copy the source's weights into the freshly initialised model (names and shapes must fit,
    as `check_fit` found them to)."""
    own = model.state_dict()
    _check_names_and_shapes(source, own, weights)
    with torch.no_grad():
        for name, tensor in weights.items():
            own[name].copy_(tensor)
