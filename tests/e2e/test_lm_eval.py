"""docs/evaluation.md's lm-evaluation-harness walkthrough runs as written, offline, and lm-eval's
scores are octlm's own.

A micro run (trained here on the tiny dataset) is `runs/tiny`; the questions are lines of a work
the run trained on ("which line follows this one", four choices); every ```bash block of the
doc's local-task section runs in order, by bash, in one folder, with `octlm` and `lm_eval` meaning
this interpreter's. Then each choice's log-likelihood in lm-eval's samples must equal octlm's
sum of log-probs of the same tokens (lm-eval's split of context + continuation, after the BOS
the walkthrough asks for) within 1e-4, and the accuracy must be the same; lm-eval's default, no
BOS, must equal octlm's without it.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch

from octlm.generation.trained import load_model, run_tokenizer
from octlm.model.gpt import GPT
from octlm.prepare.corpus import Document
from octlm.tokenizer.core import Tokenizer
from tests.doc_blocks import run_block, section_blocks, shim, shim_env
from tests.e2e.helpers import octlm

pytest.importorskip("transformers", reason="lm-eval loads the export with transformers (hf)")
pytest.importorskip("lm_eval", reason="lm-evaluation-harness is the eval extra: octlm[eval]")

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[2] / "docs" / "evaluation.md"
CONTEXT = 64  # the tiny dataset's; every question + choice fits, so lm-eval cuts nothing
QUESTIONS = 40
CHOICES = 4
TOLERANCE = 1e-4


def walkthrough_blocks() -> list[str]:
    return section_blocks(DOC, "lm-evaluation-harness on a local task (offline)")


def lm_eval_split(
    tok: Tokenizer, context: str, continuation: str, bos: bool
) -> tuple[list[int], list[int]]:
    """lm-eval's `_encode_pair` for a causal model: trailing spaces move to the continuation; the
    continuation is what follows the context's token count in the encoding of both together.
    `bos`: the tokenizer prepends BOS to both encodings (`add_bos_token=True`)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    start = [tok.bos_id] if bos else []
    whole = start + tok.encode(context + continuation, add_special_tokens=False)
    context_ids = start + tok.encode(context, add_special_tokens=False)
    return context_ids, whole[len(context_ids) :]


@torch.no_grad()
def octlm_loglikelihood(
    model: GPT, tok: Tokenizer, context: str, continuation: str, bos: bool
) -> float:
    """The summed log-probs of the continuation's tokens given the context's, by octlm's model."""
    context_ids, continuation_ids = lm_eval_split(tok, context, continuation, bos)
    ids = context_ids + continuation_ids
    assert len(ids) - 1 <= CONTEXT, "lm-eval would cut this one from the left"
    logp = torch.log_softmax(model(torch.tensor([ids[:-1]])).double(), dim=-1)[0]
    start = len(context_ids) - 1  # the position whose output predicts the first continuation token
    picked = logp[start:].gather(1, torch.tensor(continuation_ids)[:, None])
    return float(picked.sum())


def questions(work: Document, tok: Tokenizer) -> list[dict]:
    """Consecutive verse lines of `work`: the first is the context, the second the right choice
    among three other lines of the work. Only pairs that fit the context are kept."""
    lines = [line.strip() for line in work.text.splitlines()]
    ok = [20 <= len(line) <= 60 for line in lines]
    pairs = [(lines[i], lines[i + 1]) for i in range(len(lines) - 1) if ok[i] and ok[i + 1]]
    pool = sorted({line for line, keep in zip(lines, ok, strict=True) if keep})
    rng = random.Random(17)
    out = []
    for context, right in rng.sample(pairs, 4 * QUESTIONS):
        wrong = rng.sample([line for line in pool if line not in (context, right)], CHOICES - 1)
        gold = rng.randrange(CHOICES)
        choices = wrong[:gold] + [right] + wrong[gold:]
        longest = max(len(tok.encode(f"{context}\n{c}", add_special_tokens=False)) for c in choices)
        if longest <= CONTEXT:
            out.append({"context": context, "choices": choices, "gold": gold})
        if len(out) == QUESTIONS:
            return out
    raise AssertionError(f"only {len(out)} questions fit the context")


@pytest.fixture(scope="module")
def work_dir(tiny_dataset: Path, tmp_path_factory) -> Path:
    """The walkthrough's folder: runs/tiny, a micro model trained 30 steps (~2 s)."""
    work = tmp_path_factory.mktemp("lm_eval") / "work"
    out = str(work / "runs/tiny")
    octlm(
        *("train", "--model", "micro", "--data", str(tiny_dataset), "--out", out),
        *("--context", str(CONTEXT), "--steps", "30", "--warmup", "3", "--lr", "3e-3"),
        *("--micro-batch", "4", "--accum", "1", "--dtype", "fp32", "--val-every", "0"),
        *("--val-batches", "1", "--ckpt-every", "0", "--no-async-checkpoint", "--no-progress"),
    )
    return work


@pytest.fixture(scope="module")
def octlm_run(work_dir: Path) -> tuple[GPT, Tokenizer]:
    model, meta = load_model(work_dir / "runs/tiny")
    return model.eval(), run_tokenizer(meta)


@pytest.fixture(scope="module")
def qs(octlm_run, corpus_docs, work_dir: Path) -> list[dict]:
    """tasks/next_line.jsonl, from a work the run trained on."""
    work = sorted(corpus_docs, key=lambda d: d.id)[0]
    out = questions(work, octlm_run[1])
    (work_dir / "tasks").mkdir()
    (work_dir / "tasks/next_line.jsonl").write_text(
        "".join(json.dumps(q) + "\n" for q in out), encoding="utf-8"
    )
    return out


@pytest.fixture(scope="module")
def walkthrough(work_dir: Path, qs, tmp_path_factory) -> Path:
    """Every block run in order; the folder, now with runs/tiny-hf, tasks/ and results/."""
    tmp = tmp_path_factory.mktemp("lm_eval_env")
    # HF_HOME: the datasets cache and whatever else Hugging Face writes stay out of the user's.
    env = shim_env(shim(tmp, "octlm", "lm_eval"), HF_HOME=str(tmp / "hf-home"))
    for block in walkthrough_blocks():
        run_block(block, work_dir, env)
    return work_dir


def test_the_walkthrough_has_export_task_and_run() -> None:
    blocks = walkthrough_blocks()
    assert len(blocks) == 3, blocks
    assert blocks[0].startswith("octlm export runs/tiny runs/tiny-hf")
    assert "dataset_path: json" in blocks[1] and "output_type: multiple_choice" in blocks[1]
    assert "HF_DATASETS_OFFLINE=1" in blocks[2] and "--log_samples" in blocks[2]
    assert "add_bos_token=True" in blocks[2]


def test_lm_eval_scores_are_octlms_with_bos(walkthrough: Path, octlm_run, qs) -> None:
    model, tok = octlm_run
    results = walkthrough / "results/tiny"
    (samples_file,) = results.rglob("samples_next_line_*.jsonl")
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    (results_file,) = results.rglob("results_*.json")
    acc = json.loads(results_file.read_text())["results"]["next_line"]["acc,none"]
    assert len(samples) == QUESTIONS

    worst, worst_without_bos, right = 0.0, 0.0, 0
    for sample in sorted(samples, key=lambda s: s["doc_id"]):
        q = qs[sample["doc_id"]]
        args = [(a["arg_0"], a["arg_1"]) for a in sample["arguments"].values()]
        # lm-eval scored what the task file says: the context, then "\n" + each choice.
        assert args == [(q["context"], "\n" + c) for c in q["choices"]]
        theirs = [float(r[0]) for r in sample["filtered_resps"]]
        ours = [octlm_loglikelihood(model, tok, *a, bos=True) for a in args]
        without = [octlm_loglikelihood(model, tok, *a, bos=False) for a in args]
        worst = max(worst, *(abs(a - b) for a, b in zip(theirs, ours, strict=True)))
        worst_without_bos = max(
            worst_without_bos, *(abs(a - b) for a, b in zip(theirs, without, strict=True))
        )
        pick = max(range(CHOICES), key=ours.__getitem__)
        assert sample["acc"] == float(pick == q["gold"])
        right += pick == q["gold"]
    print(
        f"\nwith BOS: max |lm-eval - octlm| {worst:.2e} (octlm without BOS: "
        f"{worst_without_bos:.2e}); acc {right}/{QUESTIONS}"
    )
    assert worst < TOLERANCE
    assert worst_without_bos > 10 * TOLERANCE  # control: the BOS is really there
    assert acc == right / QUESTIONS


def test_octlm_eval_tasks_agrees_with_lm_eval(walkthrough: Path, qs) -> None:
    """`octlm eval --tasks` on the same questions (scored as the YAML says: "\n" + choice)
    gives lm-eval's acc and acc_norm within 0.5 points (here: the same questions right)."""
    results = walkthrough / "results/tiny"
    (results_file,) = results.rglob("results_*.json")
    theirs = json.loads(results_file.read_text())["results"]["next_line"]
    tasks = walkthrough / "tasks/next_line_nl.jsonl"
    tasks.write_text("".join(json.dumps({**q, "delimiter": "\n"}) + "\n" for q in qs))
    proc = octlm("eval", str(walkthrough / "runs/tiny"), "--tasks", str(tasks))
    found = re.search(r"acc ([\d.]+)  acc_norm ([\d.]+)  \((\d+) questions\)", proc.stdout)
    assert found and int(found[3]) == QUESTIONS, proc.stdout
    print(
        f"\nlm-eval {theirs['acc,none']}, {theirs['acc_norm,none']}; octlm {found[1]}, {found[2]}"
    )
    assert abs(float(found[1]) - theirs["acc,none"]) <= 0.005
    assert abs(float(found[2]) - theirs["acc_norm,none"]) <= 0.005


def test_lm_eval_default_scores_without_bos(walkthrough: Path, octlm_run, qs) -> None:
    """Without add_bos_token, lm-eval's own HF model (in this process) scores the same requests
    as octlm does with no BOS: the exported tokenizer adds no special tokens."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    model, tok = octlm_run
    lm = HFLM(pretrained=str(walkthrough / "runs/tiny-hf"), dtype="float32", device="cpu")
    args = [(q["context"], "\n" + c) for q in qs for c in q["choices"]]
    assert lm._encode_pair(*args[0]) == lm_eval_split(tok, *args[0], bos=False)
    requests = [Instance("loglikelihood", doc={}, arguments=a, idx=i) for i, a in enumerate(args)]
    theirs = [ll for ll, _ in lm.loglikelihood(requests, disable_tqdm=True)]
    ours = [octlm_loglikelihood(model, tok, *a, bos=False) for a in args]
    worst = max(abs(a - b) for a, b in zip(theirs, ours, strict=True))
    print(f"\nwithout BOS: max |lm-eval - octlm| {worst:.2e}")
    assert worst < TOLERANCE


def test_the_docs_bos_check_prints_true(walkthrough: Path, monkeypatch, capsys) -> None:
    """The doc's snippet for checking that a transformers version honours add_bos_token."""
    text = DOC.read_text(encoding="utf-8")
    (snippet,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    monkeypatch.chdir(walkthrough)
    exec(compile(snippet, str(DOC), "exec"), {})
    assert capsys.readouterr().out == "True\n"
