"""bench/gpu_check.py's `determinism` section: what each part of --deterministic costs and
whether it alone keeps a stopped and resumed run on the straight run's bits.

The combinations (`COMBOS`): no part, each part alone and all of them (`--deterministic`), on
the first of `--models` (`small` by default) with bf16 and fused AdamW; `inductor` and `all`
compiled, timed against a compiled run without parts (`none+compile`), the others against
`none`. Each combination's step time is the median over `--rounds` rounds, interleaved round
by round in one process (the order reversed every other round); a run sets every part it
names and puts back the ones it leaves off, so each times its own. On CUDA the cuBLAS
workspace `algorithms` fixes is set for the whole timing (torch may read it once per
process), so every combination is timed on the same workspace. Then `verify-resume` of each:
a straight run, and a run stopped at `--split` and resumed, each in its own process, compared
by weights and optimizer hashes (`identical` or where it parts). On a CPU it is a smoke test
of the script: its kernels repeat without any part, and `attention` is a CUDA part.

`--det-combos` picks and orders the combinations (`none+compile`, `inductor` and `all`
compile: a few minutes each on a GPU, slow on a small CPU).
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from bench.common import gpu_config, step_times_and_memory
from octlm.config.run import DETERMINISM_PARTS
from octlm.config.train import TrainConfig

COMBOS: dict[str, tuple[tuple[str, ...], bool]] = {
    "none": ((), False),
    "algorithms": (("algorithms",), False),
    "attention": (("attention",), False),
    "none+compile": ((), True),
    "inductor": (("inductor",), True),
    "all": (DETERMINISM_PARTS, True),
}
"""Each combination: the parts it turns on, and whether the model is compiled."""
BASELINE = {False: "none", True: "none+compile"}
"""What a combination's step time is compared with: the run without parts, compiled alike."""
CUBLAS_WORKSPACE = ":4096:8"


def combo_config(model: str, args: argparse.Namespace, name: str) -> TrainConfig:
    """The run of one combination: bf16, fused AdamW, its parts (all of them spelt
    --deterministic, as users do) and compiled where `COMBOS` says."""
    parts, compiled = COMBOS[name]
    keys: dict[str, Any] = (
        {"deterministic": True}
        if parts == DETERMINISM_PARTS
        else {"deterministic_parts": ",".join(parts) or None}
    )
    return gpu_config(model, args, args.steps, fused=True, compile=compiled, **keys)


def combo_names(args: argparse.Namespace) -> list[str]:
    """`--det-combos` as a list; an unknown name ends the script in one line."""
    names = [n.strip() for n in args.det_combos.split(",") if n.strip()]
    unknown = sorted(set(names) - set(COMBOS))
    if unknown:
        raise SystemExit(f"unknown combination(s) {unknown}: choose from {', '.join(COMBOS)}")
    return names


def time_combos(model: str, args: argparse.Namespace, names: list[str]) -> dict[str, float]:
    """Each combination's median step time (seconds) over the rounds, interleaved."""
    cuda = args.device.startswith("cuda")
    before = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if cuda:  # one workspace for every combination, as `algorithms` fixes it
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = before or CUBLAS_WORKSPACE
    times: dict[str, list[float]] = {name: [] for name in names}
    try:
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                gaps, _ = step_times_and_memory(combo_config(model, args, name))
                times[name].append(statistics.median(gaps))
    finally:  # the verify-resume runs of `none` must not inherit it
        if before is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    return {name: statistics.median(t) for name, t in times.items()}


def straight_equals_split(cfg: TrainConfig, split: int) -> str:
    """verify-resume's verdict for the run stopped at `split` and resumed in a new process."""
    from octlm.tools.verify import verify_resume

    summaries, _ = verify_resume(cfg, [split], keep=False, echo=lambda _: None)
    return summaries[1].verdict


def determinism(args: argparse.Namespace) -> None:
    """The section: the timing table, then straight = split for each combination."""
    names = combo_names(args)
    model = args.models.split(",")[0]
    medians = time_combos(model, args, names)
    print(f"\n{model}, bf16 + fused, median of {args.rounds} rounds, on {args.device}:")
    print("| combination | parts | compile | step ms | time vs baseline | straight = split |")
    print("|---|---|---|---:|---:|---|")
    matched = []
    for name in names:
        parts, compiled = COMBOS[name]
        base = BASELINE[compiled]
        ratio = f"{medians[name] / medians[base]:.3f} vs {base}" if base in medians else "-"
        verdict = straight_equals_split(combo_config(model, args, name), args.split)
        if verdict == "identical":
            matched.append(name)
        shown = ",".join(parts) or "-"
        print(
            f"| {name} | {shown} | {'yes' if compiled else 'no'} | {medians[name] * 1e3:.1f} | "
            f"{ratio} | {verdict} |",
            flush=True,
        )
    print(f"straight = split (stopped at {args.split}, resumed in a new process): {matched}")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The section's own flags, on bench/gpu_check.py's parser."""
    ap.add_argument(
        "--det-combos",
        default=",".join(COMBOS),
        help=f"the determinism section's combinations, in order (of {', '.join(COMBOS)})",
    )
