"""Rebuild the task octlm ships, octlm/assets/tasks/next_line.jsonl: "which line follows this
one", four choices, from the works of the embedded corpus that `octlm prepare`'s default split
holds out for validation (so a model trained on the demo data never saw them).

    python scripts/build_tasks.py

Each question: a verse line of 20-60 characters as the context, the line after it as the right
choice, three other lines of the same work as the wrong ones, in a seeded order; the choices
follow the context after a newline (`"delimiter": "\\n"`). Deterministic: the same file every
time (its sha256 is printed).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from octlm.prepare.corpus import embedded_documents
from octlm.prepare.split import TRAIN, KeyTable, SplitRule, plan_split

OUT = Path(__file__).resolve().parent.parent / "octlm" / "assets" / "tasks" / "next_line.jsonl"
PER_WORK = 50
SEED = 29


def held_out_works() -> list:
    docs = sorted(embedded_documents(), key=lambda d: d.id)
    keys = KeyTable()
    for doc in docs:
        keys.add(doc.id, len(doc.text))
    # The default rule's token cap (10M) is far above the corpus: every candidate is held out.
    labels = plan_split(keys, SplitRule()).labels
    return [d for d, label in zip(docs, labels, strict=True) if label != TRAIN]


def questions(text: str, rng: random.Random) -> list[dict]:
    lines = [line.strip() for line in text.splitlines()]
    fits = [20 <= len(line) <= 60 for line in lines]
    pairs = [i for i in range(len(lines) - 1) if fits[i] and fits[i + 1]]
    pool = sorted({line for line, ok in zip(lines, fits, strict=True) if ok})
    out = []
    for i in sorted(rng.sample(pairs, PER_WORK)):
        wrong = rng.sample([x for x in pool if x not in (lines[i], lines[i + 1])], 3)
        gold = rng.randrange(4)
        choices = wrong[:gold] + [lines[i + 1]] + wrong[gold:]
        out.append({"context": lines[i], "choices": choices, "gold": gold, "delimiter": "\n"})
    return out


def main() -> None:
    rng = random.Random(SEED)
    works = held_out_works()
    rows = [q for work in works for q in questions(work.text, rng)]
    text = "".join(json.dumps(q, ensure_ascii=False) + "\n" for q in rows)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    digest = hashlib.sha256(text.encode()).hexdigest()
    print(f"wrote {OUT}: {len(rows)} questions from {[w.id for w in works]}, sha256 {digest}")


if __name__ == "__main__":
    main()
