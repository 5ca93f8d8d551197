"""trainer.precision=auto (launch/host.resolve_precision): bf16 where the device computes it natively."""
from __future__ import annotations

from pathlib import Path

import pytest

from rlhf_dyna.launch import host


@pytest.mark.parametrize("flags, native", [("fpu avx512f avx512_bf16 amx_tile", True), ("fpu amx_bf16", True),
                                           ("fpu avx2 avx512f avx512_vnni", False)])
def test_bf16_instructions_are_read_from_the_flags_line(tmp_path: Path, flags: str, native: bool) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: some cpu\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert host.cpu_computes_bf16(cpuinfo) is native


def test_no_cpuinfo_is_the_slow_path(tmp_path: Path) -> None:
    assert host.cpu_computes_bf16(tmp_path / "missing") is False
    (tmp_path / "empty").write_text("processor\t: 0\n")
    assert host.cpu_computes_bf16(tmp_path / "empty") is False


@pytest.mark.parametrize("native", [True, False])
def test_auto_is_bf16_on_cuda_or_a_bf16_cpu_and_explicit_values_stay(monkeypatch: pytest.MonkeyPatch,
                                                                     native: bool) -> None:
    monkeypatch.setattr(host, "cpu_computes_bf16", lambda: native)
    assert host.resolve_precision("auto", cuda=True) == "bf16"
    assert host.resolve_precision("auto", cuda=False) == ("bf16" if native else "fp32")
    assert host.resolve_precision("fp32", cuda=True) == "fp32"
    assert host.resolve_precision("bf16", cuda=False) == "bf16"
