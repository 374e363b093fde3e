"""--deterministic's parts: which process-wide switches each sets, that a part left off goes
back to what the process had, and how the parts are spelt in the config. The CUDA switches are
torch's global flags, set the same without a GPU."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from octlm.config.rules import ConfigError
from octlm.config.run import DETERMINISM_PARTS
from octlm.config.train import TrainConfig
from octlm.trainer.state import configure_determinism, read_inductor, read_sdp

CUDA, CPU = torch.device("cuda"), torch.device("cpu")
ALL_SDP = (True, True, True, True)


def switches() -> dict[str, object]:
    return {
        "algorithms": torch.are_deterministic_algorithms_enabled(),
        "inductor": read_inductor(),
        "sdp": read_sdp(),
        "cudnn": (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic),
        "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }


@pytest.fixture
def before() -> Iterator[dict[str, object]]:
    """The process's switches; every part set back off afterwards."""
    start = switches()
    assert start["algorithms"] is False and start["sdp"] == ALL_SDP
    yield start
    configure_determinism((), CUDA)
    assert switches() == start


def test_each_part_alone_sets_its_own_switches(before) -> None:
    configure_determinism(("algorithms",), CUDA)
    assert switches() == {
        **before,
        "algorithms": True,
        "cudnn": (False, True),
        "cublas": before["cublas"] or ":4096:8",
    }
    configure_determinism(("attention",), CUDA)  # math SDPA only; algorithms back off
    assert switches() == {**before, "sdp": (False, False, False, True)}
    configure_determinism(("inductor",), CUDA)
    assert switches() == {**before, "inductor": True}
    configure_determinism((), CUDA)
    assert switches() == before


def test_all_parts_are_the_old_flag(before) -> None:
    """torch's own flash and memory-efficient backwards are deterministic under algorithms:
    attention beside it keeps the backends (so --deterministic computes as it always did)."""
    configure_determinism(DETERMINISM_PARTS, CUDA)
    assert switches() == {
        **before,
        "algorithms": True,
        "inductor": True,
        "cudnn": (False, True),
        "cublas": before["cublas"] or ":4096:8",
    }


def test_on_a_cpu_attention_leaves_the_kernels_and_cuda_settings_alone(before) -> None:
    configure_determinism(("attention",), CPU)
    assert switches() == before
    configure_determinism(("algorithms",), CPU)
    assert switches() == {**before, "algorithms": True}


def test_the_config_spells_the_parts_one_way() -> None:
    assert TrainConfig().hardware.determinism_parts == ()
    assert TrainConfig(deterministic=True).hardware.determinism_parts == DETERMINISM_PARTS
    cfg = TrainConfig(deterministic_parts=" inductor,algorithms, inductor")
    assert cfg.hardware.deterministic_parts == "algorithms,inductor"
    assert cfg.hardware.determinism_parts == ("algorithms", "inductor")
    assert cfg.fingerprint_for(1) == TrainConfig(
        deterministic_parts="algorithms,inductor"
    ).fingerprint_for(1)
    assert cfg.trajectory()["deterministic_parts"] == "algorithms,inductor"
    assert "deterministic_parts" not in TrainConfig(deterministic=True).trajectory()


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        ({"deterministic_parts": "fast"}, "names unknown part(s) fast"),
        ({"deterministic_parts": " , "}, "names no part"),
        ({"deterministic": True, "deterministic_parts": "attention"}, "every part already"),
        ({"deterministic_parts": "attention,inductor,algorithms"}, "names every part"),
    ],
)
def test_bad_parts_are_refused_in_one_line(keys, problem) -> None:
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")) as err:
        TrainConfig(**keys)
    assert "\n" not in str(err.value)
