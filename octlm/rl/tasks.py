"""Verifiable tasks for `octlm rl`: problems generated, not read (no dataset, no download), each a
pure function of (seed, step, index), and a checker that turns a reply into a reward.

Purity: a problem's generator is `random.Random(n)` with `n` from sha256 of the task's name, the
stream and the key, drawing with `randrange` and `choice` only. CPython seeds a Random from an
int the same way on every platform since 3.2 and draws both from `getrandbits`, so the problems
do not depend on the process, the hash seed, the platform or the Python version; the global RNGs
are never touched. Held out: one problem in `HELDOUT_SHARE`, by a hash of its prompt, is never
drawn for training or chat data (such a draw is redrawn, deterministically); those are the only
problems `heldout(n)` returns, so the two are disjoint whatever the seed and n.

Torch-free. `reasoning_gym:NAME` wraps that package's generators behind the same interface.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib.metadata
import random
import re
import string
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from octlm.config.checks import shown
from octlm.errors import OctlmError

REWARD_CORRECT, REWARD_WELL_FORMED, REWARD_MALFORMED = 1.0, 0.1, 0.0
"""1 for the canonical answer; 0.1 for a reply of the right form that is wrong; 0 otherwise.

Why a format reward: after a short format fine-tune a tiny model still writes malformed replies,
and a group of replies that all score 0 has no advantage to learn from; 0.1 lets a group that
mixes well-formed and malformed replies teach the form. Why small: once every reply of a group
is well formed the 0.1 is a constant the group's mean removes, leaving only correctness; in a
mixed group correct minus well-formed (0.9) is 9x well-formed minus malformed, so the pull
toward the answer dominates the pull toward the form. Any value in (0, 1) keeps correct above
well-formed above malformed in every group. No partial credit (some digits right, a list half
sorted): it is what a policy learns to collect without solving the task. A reasoning_gym task
is the exception: its reward is the package's own score, which may give partial credit."""
TASKS_VERSION = 1
"""Bumped when a built-in task's problems or checker change: a resume compares `Task.version`."""
HELDOUT_SHARE = 10
"""One problem in this many is held out (by a hash of its prompt)."""
MAX_REDRAWS = 1000
"""Draws of one problem before the task is called too small (all held out, or none)."""
MAX_DIGITS = 15
"""addition:N up to 15 digits: the sum stays below 2**53, exact in any JSON reader."""
MAX_LENGTH = 16
"""sorting:N up to 16 numbers: prompt and reply stay well inside the tiny preset's context."""
NUMBER = re.compile(r"[0-9]+")  # ASCII digits only: `\d` would take other scripts' digits
NUMBERS = re.compile(r"[0-9]+( [0-9]+)*")


@dataclass(frozen=True)
class Problem:
    """One problem: `prompt` is the user turn's text, `answer` the canonical assistant reply,
    `data` what generated it (the operands, the list, the word and letter, a seed)."""

    prompt: str
    answer: str
    data: tuple[Any, ...] = ()


def derive_seed(*parts: object) -> int:
    """A 64-bit integer from sha256 of the parts' text: the same in every process."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big")


class Task(ABC):
    """A task: `name` (the canonical spec, `addition:2`), `version` (what its problems depend
    on), `problem(seed, step, index)`, `heldout(n)`, and the checker `reward` / `correct`.

    The checker is strict: the reply with surrounding whitespace stripped must equal the
    canonical answer to be correct, and match the task's form (`well_formed`) to earn
    REWARD_WELL_FORMED; any other text (a '+', a trailing '.', "The answer is 5") earns 0."""

    form: ClassVar[re.Pattern[str]] = NUMBER
    """What a well-formed reply matches, whole, once stripped."""

    @property
    @abstractmethod
    def name(self) -> str: ...

    @property
    def version(self) -> str:
        return f"octlm-tasks {TASKS_VERSION}"

    @abstractmethod
    def make(self, seed: int) -> Problem:
        """The problem a 64-bit seed gives (a pure function of it)."""

    def well_formed(self, reply: str) -> bool:
        """Whether the reply, stripped, has the form of an answer (right or wrong)."""
        return self.form.fullmatch(reply.strip()) is not None

    def is_held_out(self, problem: Problem) -> bool:
        return derive_seed(self.name, "held-out", problem.prompt) % HELDOUT_SHARE == 0

    def problem(self, seed: int, step: int, index: int) -> Problem:
        """The training problem `index` of optimizer step `step` of a run seeded `seed`."""
        return self.draw("train", seed, step, index)

    def draw(self, stream: str, *key: object) -> Problem:
        """A problem of `stream` ("train", "chat") at `key`, never a held-out one."""
        for attempt in range(MAX_REDRAWS):
            found = self.make(derive_seed(self.name, stream, *key, attempt))
            if not self.is_held_out(found):
                return found
        raise OctlmError(
            f"task {self.name} drew only held-out problems in {MAX_REDRAWS} tries",
            "use a task with more problems (more digits, a longer list)",
        )

    def heldout(self, n: int) -> list[Problem]:
        """The first `n` held-out problems of the held-out stream: the same for every run and
        seed, `heldout(k) == heldout(n)[:k]`, drawn as training problems are, so the score on
        them estimates the task's own mix. On a small space (addition:1, count) a prompt may
        come twice, as often as the task draws it: kept distinct, the set would run out of
        the common answers first (count's held-out prompts were 64% zeros, against 36%)."""
        found, i, last = [], 0, 0
        while len(found) < n:
            candidate = self.make(derive_seed(self.name, "heldout", i))
            if self.is_held_out(candidate):
                found.append(candidate)
                last = i
            elif i - last > MAX_REDRAWS:
                raise OctlmError(
                    f"task {self.name} drew no held-out problem in {MAX_REDRAWS} tries",
                    "use a task with more problems (more digits, a longer list)",
                )
            i += 1
        return found

    def correct(self, problem: Problem, reply: str) -> bool:
        return reply.strip() == problem.answer

    def reward(self, problem: Problem, reply: str) -> float:
        if self.correct(problem, reply):
            return REWARD_CORRECT
        return REWARD_WELL_FORMED if self.well_formed(reply) else REWARD_MALFORMED


@dataclass(frozen=True)
class Addition(Task):
    """Two numbers of exactly `digits` digits each (0-9 for one digit); the reply is their sum."""

    digits: int = 2

    @property
    def name(self) -> str:
        return f"addition:{self.digits}"

    def make(self, seed: int) -> Problem:
        rng = random.Random(seed)
        low = 0 if self.digits == 1 else 10 ** (self.digits - 1)
        a, b = rng.randrange(low, 10**self.digits), rng.randrange(low, 10**self.digits)
        return Problem(f"What is {a} + {b}? Reply with the number only.", str(a + b), (a, b))


@dataclass(frozen=True)
class Sorting(Task):
    """`length` numbers from 0 to 99 (repeats allowed); the reply is them in ascending order,
    separated by single spaces (" 7" is one BPE pre-token; a comma would add one per number)."""

    length: int = 4
    form: ClassVar[re.Pattern[str]] = NUMBERS

    @property
    def name(self) -> str:
        return f"sorting:{self.length}"

    def make(self, seed: int) -> Problem:
        rng = random.Random(seed)
        numbers = tuple(rng.randrange(100) for _ in range(self.length))
        prompt = f"Sort these numbers from smallest to largest: {' '.join(map(str, numbers))}"
        return Problem(prompt, " ".join(map(str, sorted(numbers))), numbers)


WORD_LIST = """apple banana cherry letter strawberry mississippi balloon coffee committee bookkeeper
    address parallel pepper summer yellow giraffe puzzle butter kitten little bottle middle
    grammar success mirror carrot hammer rabbit button cotton ribbon dinner happy sunny
    assessment possession tomorrow terrace necessary accommodate occurrence embarrass
    cinnamon pineapple avocado broccoli zucchini spaghetti umbrella elephant hippopotamus
    alphabet character sentence paragraph question answer number seventeen eleven thirteen
    window kitchen garden forest mountain river valley meadow harbor island castle village
    mother father sister brother teacher student doctor farmer baker sailor soldier singer
    orange purple silver golden crimson scarlet emerald indigo violet turquoise
    morning evening midnight afternoon weekend holiday calendar seasons autumn winter spring
    keyboard computer monitor printer internet software library program function variable
    chocolate marshmallow vanilla caramel pretzel noodle pancake waffle cookie muffin
    bicycle airplane rocket engine tunnel bridge street avenue highway railroad
    beautiful wonderful terrible horrible possible impossible excellent different"""
WORDS = tuple(WORD_LIST.split())
"""The count task's words: repeated letters, and a few that trip people and models up."""


@dataclass(frozen=True)
class Count(Task):
    """How many times a letter appears in a word; the reply is the number. The count is drawn
    first, uniformly from those the word has (0 among them), then a letter with it: drawn
    letter-first, "1" would be the answer half the time, a reply that needs no counting."""

    @property
    def name(self) -> str:
        return "count"

    def make(self, seed: int) -> Problem:
        rng = random.Random(seed)
        word = rng.choice(WORDS)
        by_count: dict[int, list[str]] = {}
        for letter in string.ascii_lowercase:  # alphabetical: the lists' order is fixed
            by_count.setdefault(word.count(letter), []).append(letter)
        letter = rng.choice(by_count[rng.choice(sorted(by_count))])
        prompt = (
            f'How many times does the letter "{letter}" appear in "{word}"? '
            "Reply with the number only."
        )
        return Problem(prompt, str(word.count(letter)), (word, letter))


BUILT_IN = {
    "addition": (Addition, "DIGITS", MAX_DIGITS),
    "sorting": (Sorting, "LENGTH", MAX_LENGTH),
}
BUILT_IN_PLAIN = {"count": Count}
KNOWN = "addition[:DIGITS], sorting[:LENGTH], count, or reasoning_gym:NAME"
GYM = "reasoning_gym"


def is_task_name(spec: str) -> bool:
    """Whether `spec` names a task of this module (right or wrong after its colon)."""
    return spec.partition(":")[0] in {*BUILT_IN, *BUILT_IN_PLAIN, GYM}


def get_task(spec: str) -> Task:
    """The task a spec names: `addition` (2 digits) or `addition:N` (N from 1 to 15),
    `sorting` (4 numbers) or `sorting:N` (2 to 16), `count`, `reasoning_gym:NAME`; anything
    else is a one-line error."""
    if not isinstance(spec, str):
        raise OctlmError(f"task {shown(spec)} is not a name", f"name one of {KNOWN}")
    base, colon, param = spec.partition(":")
    if base == GYM:
        return _gym_task(param)
    if base in BUILT_IN_PLAIN:
        if colon:
            raise OctlmError(f"task {base} takes no parameter, got {shown(spec)}", f"use {base}")
        return BUILT_IN_PLAIN[base]()
    if base not in BUILT_IN:
        raise OctlmError(f"unknown task {shown(spec)}", f"use one of {KNOWN}")
    cls, what, most = BUILT_IN[base]
    if not colon:
        return cls()
    low = 1 if base == "addition" else 2
    if NUMBER.fullmatch(param) is None or not low <= int(param) <= most:
        raise OctlmError(
            f"task {shown(spec)}: {what} must be a whole number from {low} to {most}",
            f"use e.g. {cls().name}",
        )
    return cls(int(param))


@dataclass(frozen=True)
class ReasoningGym(Task):
    """One of the reasoning_gym package's generators: problem k is item 0 of the dataset
    seeded k (its generators draw from `Random(seed + index)`), the reward its `score_answer`
    of the stripped reply, in [0, 1]; correct is a score of 1. Its problems change with the
    package's version (`version` names it)."""

    dataset: str

    @property
    def name(self) -> str:
        return f"{GYM}:{self.dataset}"

    @property
    def version(self) -> str:
        _gym()  # installed, or a one-line error
        return f"{GYM} {importlib.metadata.version(GYM)}"  # its __version__ lags the release

    def make(self, seed: int) -> Problem:
        seed %= 2**31  # one generator seeds numpy's global RNG, which takes 32 bits
        entry, _ = _gym_entry(self.dataset, seed)
        return Problem(str(entry["question"]), str(entry["answer"]), (seed,))

    def well_formed(self, reply: str) -> bool:
        return reply.strip() != ""

    def reward(self, problem: Problem, reply: str) -> float:
        """The package's score; a reply its scorer cannot read (it raises: prime_factorization
        parses the reply as integers) is malformed, 0, not the end of the run."""
        entry, dataset = _gym_entry(self.dataset, problem.data[0])
        try:
            score = float(dataset.score_answer(reply.strip(), entry))
        except Exception:  # noqa: BLE001 (any error of the package's scorer: a malformed reply)
            return REWARD_MALFORMED
        return score if 0.0 <= score <= 1.0 else REWARD_MALFORMED

    def correct(self, problem: Problem, reply: str) -> bool:
        return self.reward(problem, reply) >= 1.0


def _gym() -> Any:
    try:
        with warnings.catch_warnings():
            # A dependency's own source (cellpylib: `is` with a literal) warns when
            # compiled, which a fresh install does on first import: not the user's to see.
            warnings.simplefilter("ignore", SyntaxWarning)
            import reasoning_gym
    except ImportError:
        raise OctlmError(
            f"task {GYM}:NAME needs the reasoning-gym package, which is not installed",
            "install it with `pip install reasoning-gym`, or use a built-in task: "
            "addition, sorting, count",
        ) from None
    return reasoning_gym


def _gym_task(name: str) -> ReasoningGym:
    known = sorted(_gym().factory.DATASETS)
    if name not in known:
        near = difflib.get_close_matches(name, known, n=3)
        hint = f"did you mean {', '.join(near)}?" if near else f"e.g. {GYM}:chain_sum"
        raise OctlmError(
            f"reasoning_gym has no dataset {shown(name)}",
            f"name one of its {len(known)} datasets ({hint})",
        )
    _gym_entry(name, 0)  # a generator that cannot run without a configuration: one line now
    return ReasoningGym(name)


@functools.lru_cache(maxsize=4096)
def _gym_entry(dataset: str, seed: int) -> tuple[dict[str, Any], Any]:
    """(item 0, the dataset) of `dataset` seeded `seed`. A few generators draw from Python's or
    numpy's global RNG: both are seeded from `seed` for the call and restored after, so the item
    is still a pure function of the seed and the caller's global RNGs do not move."""
    import numpy as np

    gym, state, np_state = _gym(), random.getstate(), np.random.get_state()
    try:
        random.seed(seed)
        np.random.seed(seed)
        ds = gym.create_dataset(dataset, seed=seed, size=1)
        entry = ds[0]
        if not isinstance(entry, dict) or not {"question", "answer"} <= set(entry):
            raise ValueError(f"its item is {shown(entry)}, not a question and an answer")
        return entry, ds
    except OctlmError:
        raise
    except Exception as exc:  # noqa: BLE001 (the package's own error, whatever its type)
        raise OctlmError(
            f"task {GYM}:{dataset} cannot make a problem ({type(exc).__name__}: "
            f"{_first_line(exc)}): its generator needs a configuration octlm does not pass",
            f"name another of reasoning_gym's datasets (e.g. {GYM}:chain_sum)",
        ) from None
    finally:
        random.setstate(state)
        np.random.set_state(np_state)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else "no message"
