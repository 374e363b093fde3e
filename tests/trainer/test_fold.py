"""The fixed tree (octlm/trainer/fold.py) and the one-process side of the tree reduction
(octlm/trainer/reduction.py): the tree's shape, which process counts hold whole subtrees, the
buffers it costs, and that the grouping matters on real gradients (the control)."""

from __future__ import annotations

import math

import pytest
import torch

from octlm.config.train import TrainConfig
from octlm.errors import OctlmError
from octlm.model.gpt import GPT
from octlm.trainer.distributed import DistInfo
from octlm.trainer.fold import FoldStack, block_ok, fold, worlds_for
from octlm.trainer.layout import check_layout
from octlm.trainer.reduction import TreeReducer, leaf_seed
from tests.unit_model import unit_config


def shape(n: int) -> str:
    return fold([str(i) for i in range(n)], lambda a, b: f"({a}+{b})")


def test_the_tree_is_a_binary_counter_folded_from_the_left() -> None:
    assert shape(1) == "0"
    assert shape(4) == "((0+1)+(2+3))"
    assert shape(6) == "(((0+1)+(2+3))+(4+5))"
    assert shape(7) == "((((0+1)+(2+3))+(4+5))+6)"


@pytest.mark.parametrize("total", [1, 2, 4, 6, 8, 12, 16])
def test_every_allowed_layout_builds_the_one_process_tree(total: int) -> None:
    """World w, micro-batch m, rank r holds leaf m*w + r: fold each block of w leaves first
    (the exchange), then the blocks in order (the stack). It must be the one-process tree."""
    for world in worlds_for(total):
        blocks = [
            fold([str(m * world + r) for r in range(world)], lambda a, b: f"({a}+{b})")
            for m in range(total // world)
        ]
        stack: FoldStack[str] = FoldStack(lambda a, b: f"({a}+{b})")
        for block in blocks:
            stack.push(block, world if world & (world - 1) == 0 else total)
        assert stack.result() == shape(total), (total, world)


def test_the_process_counts_that_can_fold_a_step() -> None:
    assert worlds_for(8) == [1, 2, 4, 8]
    assert worlds_for(6) == [1, 2, 6]  # 3 ranks: blocks {0,1,2} and {3,4,5} are no subtrees
    assert worlds_for(12) == [1, 2, 4, 12]
    assert not block_ok(6, 3) and not block_ok(8, 3) and block_ok(5, 5)


@pytest.mark.parametrize("accum", [1, 2, 3, 4, 7, 16, 33])
def test_the_fold_holds_at_most_log2_accum_plus_one_partial_sums(accum: int) -> None:
    stack: FoldStack[int] = FoldStack(lambda a, b: a + b)
    peak = 0
    for _ in range(accum):
        stack.push(1)
        peak = max(peak, stack.depth)
    assert stack.result() == accum
    assert peak <= math.floor(math.log2(accum)) + 1


def test_a_layout_that_splits_a_subtree_is_refused_naming_the_counts_that_can() -> None:
    cfg = TrainConfig(accum=2, reduction="tree")
    check_layout(cfg, 2)
    with pytest.raises(OctlmError) as err:
        check_layout(cfg, 3)
    assert "3 processes cannot share the step's 6 micro-batches" in err.value.problem
    assert "use 1, 2, 6 process(es)" in err.value.fix
    check_layout(cfg.replace(reduction="collective"), 3)  # its bits follow the count anyway


def test_leaf_seeds_depend_on_seed_step_and_leaf_only() -> None:
    seeds = {leaf_seed(s, t, j) for s in (1, 2) for t in (0, 1) for j in range(4)}
    assert len(seeds) == 16 and all(0 <= x < 2**63 for x in seeds)
    assert leaf_seed(1337, 5, 3) == leaf_seed(1337, 5, 3)


def micro_grads(model: GPT, batches: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    grads = []
    for x in batches:
        model.zero_grad(set_to_none=True)
        loss_sum, _ = model(x[:, :-1], x[:, 1:])
        (loss_sum / 1000).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    return grads


def test_the_grouping_changes_the_bits_of_real_gradients() -> None:
    """The control for the fixed tree: 8 micro-batch gradients of a real model summed in the
    tree and summed left to right (autograd's accumulation) differ in some bits."""
    torch.manual_seed(0)
    model = GPT(unit_config(16))
    batches = [torch.randint(0, 512, (2, 17)) for _ in range(8)]
    grads = micro_grads(model, batches)
    tree = fold([list(g) for g in grads], lambda a, b: [x + y for x, y in zip(a, b, strict=True)])
    left = grads[0]
    for g in grads[1:]:
        left = [x + y for x, y in zip(left, g, strict=True)]
    assert any(not torch.equal(a, b) for a, b in zip(tree, left, strict=True))


def test_the_reducer_folds_one_process_micro_batches_in_the_tree() -> None:
    torch.manual_seed(0)
    model = GPT(unit_config(16))
    batches = [torch.randint(0, 512, (2, 17)) for _ in range(4)]
    expected = fold(
        [list(g) for g in micro_grads(model, batches)],
        lambda a, b: [x + y for x, y in zip(a, b, strict=True)],
    )
    model.zero_grad(set_to_none=True)
    reducer = TreeReducer(list(model.parameters()), DistInfo(), fsdp=False)
    reducer.start()
    for x in batches:
        loss_sum, _ = model(x[:, :-1], x[:, 1:])
        (loss_sum / 1000).backward()
        reducer.after_micro()
    reducer.finish()
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), expected, strict=True))
    grads = [p.grad for p in model.parameters()]
    rows = torch.cat([g.reshape(g.shape[0], -1).square().sum(1) for g in grads])
    norm = reducer.clip(0.0)
    assert norm == math.sqrt(math.fsum(rows.double().tolist()))
    assert math.isclose(norm, float(torch.nn.utils.get_total_norm(grads)), rel_tol=1e-5)
