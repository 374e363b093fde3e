"""The recipe options resume exactly: --optimizer muon (one process, DDP, FSDP2), --qk-norm,
--logit-softcap and --z-loss, each stopped and resumed in a new process, end bit-identical to
their straight runs (end weights, every step's loss and grad norm, the optimizer's tensors).

Each option also has a control that must differ, so each comparison is shown able to fail and
each option shown to act: a Muon resume with its momentum wiped, and each model option against
the same run without it. Every run is a real `python -m octlm train` subprocess (torchrun with
gloo for 2 processes). Stopped runs are shared: a test resumes its own copy of one.
"""

from __future__ import annotations

import math
import shutil
import tomllib
from pathlib import Path

import pytest
import torch

from octlm.config.files import SHIPPED_CONFIGS
from octlm.config.shape import ModelConfig
from octlm.device import fast_bf16_products
from octlm.model.gpt import GPT
from octlm.runlog.reader import read_log
from octlm.trainer import checkpoint as ckpt
from tests.e2e.helpers import (
    DIST_FLAGS,
    STEPS,
    assert_same_run,
    dist_args,
    end_hash,
    octlm,
    optimizer_tensors,
    steps_of,
    train_args,
)
from tests.e2e.helpers import DIST_STEPS as DSTEPS
from tests.shared import shared

pytestmark = pytest.mark.slow

MUON = ("--optimizer", "muon")
QK_NORM = ("--qk-norm",)
SOFTCAP = ("--logit-softcap", "15")
Z_LOSS = ("--z-loss", "1e-4")
ZERO_INIT = ("--zero-init-residual",)
VALUE_RESIDUAL = ("--value-residual",)
RECIPE = (*MUON, *QK_NORM, *SOFTCAP, *Z_LOSS)
SHIPPED_RECIPE = tomllib.loads((SHIPPED_CONFIGS / "recipe.toml").read_text())
SHIPPED_OPTIONS = (
    *MUON,
    "--muon-ns-steps",
    str(SHIPPED_RECIPE["muon_ns_steps"]),
    "--muon-momentum",
    str(SHIPPED_RECIPE["muon_momentum"]),
    *(("--muon-gram",) if SHIPPED_RECIPE["muon_gram"] else ()),
    *VALUE_RESIDUAL,
    *ZERO_INIT,
    *(QK_NORM if SHIPPED_RECIPE.get("qk_norm") else ()),
    *(("--rope-base", str(SHIPPED_RECIPE["rope_base"])) if "rope_base" in SHIPPED_RECIPE else ()),
)
"""octlm/configs/recipe.toml's trajectory options but the products' dtype (Muon with its
iterations, momentum and Gram form, the value residual, zero-initialised projections, QK-norm
and RoPE's base when it has them) as flags for the tiny run."""
SHIPPED = (*SHIPPED_OPTIONS, "--muon-ns-dtype", SHIPPED_RECIPE.get("muon_ns_dtype", "auto"))
"""The recipe's options with its products' dtype ("fast": bf16 on this machine if it has AMX)."""
BF16_SHAPE = ("--d-model", "96", "--d-ff", "256")
"""The tiny run narrowed for the bf16 Newton-Schulz tests: on a CPU without bf16 instructions
(an AVX2 EPYC) each bf16 product is some 75 times a float32 one's, and at tiny's 192 x 512
matrices those tests took 48-52 s each under the suite; at 96 x 256 a product has an eighth
of the work. Their controls run at the same shape."""
ACROSS_LAYOUTS = (*SHIPPED_OPTIONS, "--muon-ns-dtype", "fp32")
"""The recipe's options with float32 products, for the runs compared across layouts (another
world, FSDP). Under the collective sums those differed (FSDP on 2 ranks against one process, 6
steps: 2.7e-3 with bf16 products, 7e-7 with float32); the tree reduction makes them bitwise,
and they are compared exactly. Each layout's bf16 run is exact on its own too: split equals
straight (test_muon_bf16_fsdp2_split_equals_straight)."""
ADAMW_KEYS = {"exp_avg", "exp_avg_sq", "step"}


@pytest.fixture(scope="module")
def stopped(tiny_dataset, tmp_path_factory):
    """`stopped(k, *extra)`: a run of `train_args` + `extra` stopped at step k, built once per
    session. Read-only: `resume` a copy."""

    def get(k: int, *extra: str) -> Path:
        key = f"recipe_stopped_{k}" + "".join(f"_{x.lstrip('-')}" for x in extra)

        def build(folder: Path) -> None:
            proc = octlm(*train_args(tiny_dataset, folder / "run", "--stop-at", str(k), *extra))
            assert f"stopped at step {k}" in proc.stderr

        return shared(tmp_path_factory, key, build) / "run"

    return get


def resume(data: Path, stopped_run: Path, out: Path, *extra: str) -> Path:
    """A copy of `stopped_run` at `out`, resumed to the end in a new process."""
    shutil.copytree(stopped_run, out)
    proc = octlm(*train_args(data, out, "--resume", *extra))
    assert "resumed from" in proc.stderr
    return out


def checkpoint(run: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    path, sha = ckpt.find_checkpoint(run)
    read, tensors = ckpt.load_checkpoint(path, sha)
    return read.as_written(), tensors


def step_records(run: Path) -> list[dict]:
    return [r for r in read_log(run) if r["type"] == "step"]


# -- Muon on one process ---------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 6])  # inside the 3-step warmup, and in the cosine after it
def test_muon_split_equals_straight(tiny_dataset, straight_run, stopped, tmp_path, k) -> None:
    """With accumulation: the standard tiny arguments take 2 micro-batches a step."""
    args = train_args(tiny_dataset, tmp_path)
    assert args[args.index("--accum") + 1] == "2"
    run = resume(tiny_dataset, stopped(k, *MUON), tmp_path / "split", *MUON)
    assert_same_run(run, straight_run(*MUON))


def muon_index_names(meta: dict) -> tuple[list[str], list[str]]:
    """(names in the optimizer's index order, the Muon ones), from the checkpoint's model
    config and the groups' documented order: Muon's matrices (the blocks' 2-D weights), then
    AdamW's 2-D tensors (the tied embedding), then AdamW's 1-D norm gains."""
    named = list(GPT(ModelConfig.from_dict(meta["model_config"])).named_parameters())
    muon = [n for n, p in named if p.dim() == 2 and n.startswith("layers.")]
    adam_2d = [n for n, p in named if p.dim() == 2 and n not in muon]
    adam_1d = [n for n, p in named if p.dim() == 1]
    assert len(muon) + len(adam_2d) + len(adam_1d) == len(named)
    groups = meta["optimizer"]["param_groups"]
    assert [g["kind"] for g in groups] == ["muon", "adamw", "adamw"]
    sizes = [len(muon), len(adam_2d), len(adam_1d)]
    starts = [0, sizes[0], sizes[0] + sizes[1]]
    for group, start, size in zip(groups, starts, sizes, strict=True):
        assert group["params"] == list(range(start, start + size))
    return muon + adam_2d + adam_1d, muon


def test_muon_checkpoint_holds_momentum_for_the_blocks_matrices_only(stopped) -> None:
    meta, tensors = checkpoint(stopped(6, *MUON))
    names, muon = muon_index_names(meta)
    n_layers = meta["model_config"]["n_layers"]
    matrices = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")
    assert len(muon) == len(matrices) * n_layers
    assert all(n.rsplit(".", 2)[-2] in matrices for n in muon)
    assert names[len(muon)] == "tok_embeddings.weight"
    optim = ckpt.split_tensors(tensors, "optim.")
    for i, name in enumerate(names):
        keys = {k.split(".", 1)[1] for k in optim if k.split(".", 1)[0] == str(i)}
        weight = tensors[f"model.{name}"]
        if name in muon:
            assert keys == {"momentum_buffer"}, name
            buf = optim[f"{i}.momentum_buffer"]
            assert buf.shape == weight.shape and buf.abs().sum() > 0, name
        else:
            assert keys == ADAMW_KEYS, name
            assert optim[f"{i}.exp_avg"].shape == weight.shape, name
            assert float(optim[f"{i}.step"]) == 6, name
    assert len({k.split(".", 1)[0] for k in optim}) == len(names)


def test_control_muon_momentum_wiped_differs(tiny_dataset, straight_run, stopped, tmp_path) -> None:
    """Only the `momentum_buffer` tensors zeroed in the step-6 checkpoint (AdamW's moments
    kept): step 7's loss and grad norm still match (the wipe acts on its update), then the
    run parts from the straight one."""
    k, out = 6, tmp_path / "control"
    shutil.copytree(stopped(k, *MUON), out)
    meta, tensors = checkpoint(out)
    momentum = {n for n in tensors if n.startswith("optim.") and n.endswith(".momentum_buffer")}
    wiped = {n: torch.zeros_like(v) if n in momentum else v for n, v in tensors.items()}
    changed = {n for n in tensors if not torch.equal(tensors[n], wiped[n])}
    assert momentum and changed == momentum  # every buffer was non-zero, nothing else touched
    header = {n: v for n, v in meta.items() if n not in ("format", "format_version")}
    ckpt.save_checkpoint(out, k, header, wiped)
    octlm(*train_args(tiny_dataset, out, "--resume", *MUON))
    ref = straight_run(*MUON)
    assert steps_of(out)[: k + 1] == steps_of(ref)[: k + 1]
    assert steps_of(out)[k + 1] != steps_of(ref)[k + 1]
    assert end_hash(out) != end_hash(ref)


# -- Muon on 2 processes: DDP ----------------------------------------------------------------
# With the shipped recipe's options: the value residual hands the first block's values to the
# later ones between wrapped blocks (under FSDP2, between sharded ones).


def weights(run: Path) -> dict[str, torch.Tensor]:
    return ckpt.split_tensors(checkpoint(run)[1], "model.")


def max_weight_diff(a: Path, b: Path) -> float:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


@pytest.fixture(scope="module")
def muon_single(straight_run) -> Path:
    """One process, accumulation 2: the same global batch as 2 ranks x accumulation 1."""
    return straight_run(*DIST_FLAGS, "--accum", "2", *ACROSS_LAYOUTS)


@pytest.fixture(scope="module")
def muon_ddp(straight_run) -> Path:
    run = straight_run(*DIST_FLAGS, "--accum", "1", "--nproc", "2", *ACROSS_LAYOUTS)
    assert '"world": 2' in (run / "log.jsonl").read_text().splitlines()[0]
    return run


def test_muon_ddp_two_ranks_match_one_process_with_accumulation(muon_single, muon_ddp) -> None:
    # As the AdamW test: same global batch and data; only the order of a 2-term sum differs.
    assert max_weight_diff(muon_single, muon_ddp) == 0.0
    for (s1, l1, _), (s2, l2, _) in zip(steps_of(muon_single), steps_of(muon_ddp), strict=True):
        assert s1 == s2 and abs(l1 - l2) <= 1e-5


@pytest.mark.parametrize("direction", ["2to1", "1to2"])
def test_muon_resume_across_world_sizes(tiny_dataset, muon_single, tmp_path, direction) -> None:
    out = tmp_path / direction
    first, second = (("--nproc", "2"), ()) if direction == "2to1" else ((), ("--nproc", "2"))
    accum = ("--accum", "1" if first else "2")
    octlm(*dist_args(tiny_dataset, out, *accum, *first, "--stop-at", "3", *ACROSS_LAYOUTS))
    proc = octlm(*dist_args(tiny_dataset, out, *accum, *second, "--resume", *ACROSS_LAYOUTS))
    assert "to keep the global batch" in proc.stderr
    assert [s for s, _, _ in steps_of(out)] == list(range(1, DSTEPS + 1))
    assert max_weight_diff(muon_single, out) == 0.0


# -- Muon on 2 processes: FSDP2 --------------------------------------------------------------

FSDP = ("--accum", "1", "--nproc", "2", "--parallel", "fsdp")


def test_muon_fsdp2_split_equals_straight_and_reshards(
    tiny_dataset, straight_run, muon_single, tmp_path
) -> None:
    split, one = tmp_path / "fsdp-split", tmp_path / "fsdp-to-1"
    # Validates at step 3 before its checkpoint: FSDP2's root parameters are unsharded then.
    octlm(*dist_args(tiny_dataset, split, *FSDP, "--stop-at", "3", *ACROSS_LAYOUTS))
    shutil.copytree(split, one)
    octlm(*dist_args(tiny_dataset, split, *FSDP, "--resume", *ACROSS_LAYOUTS))
    fsdp_straight = straight_run(*DIST_FLAGS, *FSDP, *ACROSS_LAYOUTS)
    assert end_hash(split) == end_hash(fsdp_straight)
    assert steps_of(split) == steps_of(fsdp_straight)
    a, b = optimizer_tensors(split), optimizer_tensors(fsdp_straight)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    # Sharded on 2 ranks, checkpointed whole, resumed (resharded) by one process.
    octlm(
        *dist_args(
            tiny_dataset, one, "--accum", "1", "--parallel", "fsdp", "--resume", *ACROSS_LAYOUTS
        )
    )
    assert max_weight_diff(fsdp_straight, one) == 0.0
    assert max_weight_diff(muon_single, fsdp_straight) == 0.0


def test_muon_bf16_fsdp2_split_equals_straight(tiny_dataset, straight_run, tmp_path) -> None:
    """bf16 Newton-Schulz products on whole matrices gathered from 2 FSDP2 shards: split equals
    straight, and its bits are not float32's (the control)."""
    flags = (*SHIPPED_OPTIONS, *BF16_SHAPE, "--muon-ns-dtype", "bf16")
    split = tmp_path / "fsdp-bf16"
    octlm(*dist_args(tiny_dataset, split, *FSDP, "--stop-at", "3", *flags))
    octlm(*dist_args(tiny_dataset, split, *FSDP, "--resume", *flags))
    straight = straight_run(*DIST_FLAGS, *FSDP, *flags)
    assert end_hash(split) == end_hash(straight)
    assert steps_of(split) == steps_of(straight)
    fp32 = straight_run(*DIST_FLAGS, *FSDP, *ACROSS_LAYOUTS, *BF16_SHAPE)
    assert end_hash(straight) != end_hash(fp32)


# -- qk-norm, logit soft-cap, z-loss: each alone, then all with Muon --------------------------

OPTIONS = {
    "qk-norm": QK_NORM,
    "softcap": SOFTCAP,
    "z-loss": Z_LOSS,
    "zero-init": ZERO_INIT,
    "value-residual": VALUE_RESIDUAL,
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_option_split_equals_straight(
    tiny_dataset, straight_run, stopped, tmp_path, option
) -> None:
    flags = OPTIONS[option]
    run = resume(tiny_dataset, stopped(3, *flags), tmp_path / "split", *flags)
    ref = straight_run(*flags)
    assert_same_run(run, ref)
    if option == "z-loss":  # the logged term too, step by step
        assert [r["z_loss"] for r in step_records(run)] == [r["z_loss"] for r in step_records(ref)]


@pytest.mark.parametrize("option", list(OPTIONS))
def test_control_option_changes_the_run(straight_run, option) -> None:
    """Each option acts: against the same run without it, the end weights differ. qk-norm and
    the soft-cap change the forward, so the first step's loss already differs; the z-loss
    changes only the gradient, so step 1's loss is the same and step 2's is not."""
    flags, plain = OPTIONS[option], straight_run()
    run = straight_run(*flags)
    assert end_hash(run) != end_hash(plain)
    first, second = steps_of(run)[:2], steps_of(plain)[:2]
    if option == "z-loss":
        assert first[0][1] == second[0][1] and first[1][1] != second[1][1]
    else:
        assert first[0][1] != second[0][1]


def test_qk_norm_gains_are_checkpointed_and_trained(straight_run) -> None:
    model = weights(straight_run(*QK_NORM))
    n_layers = checkpoint(straight_run(*QK_NORM))[0]["model_config"]["n_layers"]
    gains = [f"layers.{i}.attention.{q}_norm.weight" for i in range(n_layers) for q in "qk"]
    assert all(not torch.equal(model[g], torch.ones_like(model[g])) for g in gains)
    assert not any(n.endswith(("q_norm.weight", "k_norm.weight")) for n in weights(straight_run()))


def test_z_loss_is_logged_at_every_step_and_only_with_it(straight_run) -> None:
    records = step_records(straight_run(*Z_LOSS))
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["z_loss"]) and r["z_loss"] > 0 for r in records)
    assert all(r["z_loss"] < r["loss"] for r in records)  # 1e-4 x log(Z)^2: a small term
    assert not any("z_loss" in r for r in step_records(straight_run()))


def test_recipe_split_equals_straight(tiny_dataset, straight_run, stopped, tmp_path) -> None:
    """Muon, qk-norm, soft-cap and z-loss together."""
    run = resume(tiny_dataset, stopped(4, *RECIPE), tmp_path / "split", *RECIPE)
    ref = straight_run(*RECIPE)
    assert_same_run(run, ref)
    assert [r["z_loss"] for r in step_records(run)] == [r["z_loss"] for r in step_records(ref)]


def test_muon_with_three_newton_schulz_steps_resumes_exactly(
    tiny_dataset, straight_run, stopped, tmp_path
) -> None:
    """--muon-ns-steps 3 (the recipe's cheaper update): split equals straight, and the run is
    not the five-step one (the control)."""
    flags = (*MUON, "--muon-ns-steps", "3")
    run = resume(tiny_dataset, stopped(3, *flags), tmp_path / "split", *flags)
    ref = straight_run(*flags)
    assert_same_run(run, ref)
    assert end_hash(ref) != end_hash(straight_run(*MUON))


def test_muon_gram_resumes_exactly(tiny_dataset, straight_run, stopped, tmp_path) -> None:
    """--muon-gram (Newton-Schulz through the Gram matrix): split equals straight, and its bits
    are not the plain form's (the control, with the same three iterations)."""
    plain = (*MUON, "--muon-ns-steps", "3")
    flags = (*plain, "--muon-gram")
    run = resume(tiny_dataset, stopped(3, *flags), tmp_path / "split", *flags)
    ref = straight_run(*flags)
    assert_same_run(run, ref)
    assert end_hash(ref) != end_hash(straight_run(*plain))


def test_muon_in_bf16_resumes_exactly(tiny_dataset, straight_run, stopped, tmp_path) -> None:
    """--muon-ns-dtype bf16 (Newton-Schulz products in bf16 on the CPU): split equals straight,
    through the Gram matrix too, and its bits are not float32's (the control)."""
    fp32 = (*MUON, "--muon-ns-steps", "3", "--muon-gram", *BF16_SHAPE)
    flags = (*fp32, "--muon-ns-dtype", "bf16")
    run = resume(tiny_dataset, stopped(3, *flags), tmp_path / "split", *flags)
    ref = straight_run(*flags)
    assert_same_run(run, ref)
    assert end_hash(ref) != end_hash(straight_run(*fp32))


def test_muon_ns_dtype_fast_runs_as_this_machines_dtype(straight_run) -> None:
    """--muon-ns-dtype fast: bf16 on a CPU with AMX, fp32 on one without; the run records
    the dtype it settled on and computes exactly what that setting computes."""
    flags = (*MUON, "--muon-ns-steps", "3", "--muon-gram")
    here = "bf16" if fast_bf16_products(torch.device("cpu")) else "fp32"
    fast = straight_run(*flags, "--muon-ns-dtype", "fast")
    assert checkpoint(fast)[0]["trajectory"]["muon_ns_dtype"] == here
    assert end_hash(fast) == end_hash(straight_run(*flags, "--muon-ns-dtype", here))


def test_the_shipped_recipes_options_resume_exactly(
    tiny_dataset, straight_run, stopped, tmp_path
) -> None:
    """octlm/configs/recipe.toml's trajectory options together, on the tiny run: Muon with three
    iterations and momentum 0.9, the value residual and zero-initialised projections. Each
    option alone has its control above; here the run without the recipe's momentum differs."""
    recipe, flags = SHIPPED_RECIPE, SHIPPED
    assert recipe["value_residual"] and recipe["zero_init_residual"]
    run = resume(tiny_dataset, stopped(4, *flags), tmp_path / "split", *flags)
    ref = straight_run(*flags)
    assert_same_run(run, ref)
    other = tuple(x if x != str(recipe["muon_momentum"]) else "0.95" for x in flags)
    assert end_hash(ref) != end_hash(straight_run(*other))


def test_a_run_of_the_recipe_before_its_rope_base_is_refused_then_resumes_exactly(
    tiny_dataset, straight_run, stopped, tmp_path
) -> None:
    """Run folders written with the recipe before `rope_base = 1024` (its default base, 10000)
    are not continued on the new base: the shipped flags are refused in one line naming the
    change and nothing on disk is touched; `--rope-base 10000` (the preset's own value, so the
    old fingerprint) resumes them onto their straight run's bits."""
    assert SHIPPED_RECIPE["rope_base"] == 1024.0
    flags = SHIPPED
    at = flags.index("--rope-base")
    old = flags[:at] + flags[at + 2 :]
    run = tmp_path / "old"
    shutil.copytree(stopped(4, *old), run)
    before = files(run)
    proc = octlm(*train_args(tiny_dataset, run, "--resume", *flags), check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--rope-base" in proc.stderr and "another config fingerprint" in proc.stderr
    assert files(run) == before
    octlm(*train_args(tiny_dataset, run, "--resume", *old, "--rope-base", "10000"))
    assert_same_run(run, straight_run(*old))
    assert end_hash(run) != end_hash(straight_run(*flags))  # the base acts: a control


def files(run: Path) -> dict[Path, bytes]:
    """A run folder's files and their bytes, but the run lock (it holds the last pid)."""
    return {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} | {
        Path(".lock"): b""
    }
