"""The build record's device: on CUDA the SM count and MIG slice beside the name, and the one
line a resume on another device gets. Hand-made records: no GPU needed."""

from __future__ import annotations

import pytest
import torch

from octlm.device import build_changes, build_info, build_notes, device_change, mig_slice

PINNED = {"MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE", "MKL_CBWR": None}
H100 = {
    "torch": "2.13.0",
    "cuda": "12.8",
    "cudnn": 91000,
    "device": "NVIDIA H100 80GB HBM3",
    "threads": 16,
    "platform": "Linux",
    "numerics": PINNED,
    "sms": 132,
    "mig": None,
}
H100_MIG = {**H100, "device": "NVIDIA H100 80GB HBM3 MIG 3g.40gb", "sms": 60, "mig": "3g.40gb"}
H200 = {**H100, "device": "NVIDIA H200", "sms": 132}
CPU = {k: v for k, v in H100.items() if k not in ("sms", "mig")}
CPU |= {"cuda": None, "cudnn": None, "device": "cpu:x86_64"}


def test_a_cpu_record_has_no_sm_count_nor_mig() -> None:
    info = build_info(torch.device("cpu"))
    assert "sms" not in info and "mig" not in info


@pytest.mark.parametrize(
    ("old", "new", "changes"),
    [
        (H100, dict(H100), []),
        (CPU, dict(CPU), []),
        # A record from before the SM count: the same GPU model is no change.
        ({k: v for k, v in H100.items() if k not in ("sms", "mig")}, H100, []),
        (
            H100,
            H100_MIG,
            [
                "written on NVIDIA H100 80GB HBM3 (132 SMs), resumed on NVIDIA H100 80GB HBM3 "
                "MIG 3g.40gb (60 SMs): bits are not promised across devices"
            ],
        ),
        (
            H100,
            H200,
            [
                "written on NVIDIA H100 80GB HBM3 (132 SMs), resumed on NVIDIA H200 (132 SMs): "
                "bits are not promised across devices"
            ],
        ),
        (  # the same name, another SM count (a board with SMs fused off)
            H100,
            {**H100, "sms": 114, "torch": "2.14.0"},
            [
                "written on NVIDIA H100 80GB HBM3 (132 SMs), resumed on NVIDIA H100 80GB HBM3 "
                "(114 SMs): bits are not promised across devices",
                "torch: '2.13.0' -> '2.14.0'",
            ],
        ),
        (  # a MIG slice whose name does not say its profile
            {**H100, "sms": 60, "mig": "profile unknown"},
            {**H100, "sms": 60},
            [
                "written on NVIDIA H100 80GB HBM3 (60 SMs, MIG slice, profile unknown), resumed "
                "on NVIDIA H100 80GB HBM3 (60 SMs): bits are not promised across devices"
            ],
        ),
        (
            CPU,
            {**CPU, "device": "cpu:aarch64"},
            ["written on cpu:x86_64, resumed on cpu:aarch64: bits are not promised across devices"],
        ),
    ],
)
def test_build_changes_name_another_device_in_one_line(old, new, changes) -> None:
    assert build_changes(old, new) == changes


def test_a_resume_notes_the_device_alone_and_the_rest_in_one_line() -> None:
    notes = build_notes(H100, {**H100_MIG, "threads": 8})
    assert notes == [
        device_change(H100, H100_MIG),
        "resuming on a different build (threads: 16 -> 8): bitwise equality with an "
        "uninterrupted run is no longer promised",
    ]
    assert build_notes(CPU, dict(CPU)) == []


@pytest.mark.parametrize(
    ("name", "visible", "index", "slice_"),
    [
        ("NVIDIA H100 80GB HBM3", None, 0, None),
        ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", None, 0, "3g.20gb"),
        ("NVIDIA A100-SXM4-40GB", "MIG-4f1c2d9e-0000-5000-8000-000000000000", 0, "profile unknown"),
        ("NVIDIA A100-SXM4-40GB", "0,MIG-4f1c2d9e", 0, None),
        ("NVIDIA A100-SXM4-40GB", "0, MIG-4f1c2d9e", 1, "profile unknown"),
        ("NVIDIA A100-SXM4-40GB", "GPU-4f1c2d9e", 0, None),
    ],
)
def test_mig_slice(name: str, visible: str | None, index: int, slice_: str | None) -> None:
    assert mig_slice(name, visible, index) == slice_
