"""TEMPORARY stand-in (replaced by the tasks helper's module)."""

from __future__ import annotations
import hashlib, json, random
from dataclasses import dataclass
from octlm.errors import OctlmError


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


def _rng(*key):
    return random.Random(
        int.from_bytes(hashlib.sha256(json.dumps(key).encode()).digest()[:8], "little")
    )


@dataclass(frozen=True)
class Addition:
    digits: int = 1
    name: str = "addition"

    def _make(self, r):
        a, b = r.randrange(10**self.digits), r.randrange(10**self.digits)
        return Problem(f"{a}+{b}", str(a + b))

    def problem(self, seed, step, index):
        return self._make(_rng("train", seed, step, index))

    def heldout(self, n):
        return [self._make(_rng("heldout", i)) for i in range(n)]

    def correct(self, problem, reply):
        return reply.strip() == problem.answer

    def reward(self, problem, reply):
        if self.correct(problem, reply):
            return 1.0
        return 0.1 if reply.strip().isdigit() else 0.0


def get_task(spec):
    if spec == "addition":
        return Addition()
    raise OctlmError(f"unknown task {spec!r}", "use addition")
