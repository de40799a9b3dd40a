"""moepack's `humming` layout against humming-kernels 0.1.19's own transform on random shapes
(bench/humming/check_random_shapes.py, in a subprocess: it patches humming for the process with
the CPU emulation of humming's three CUDA weight kernels, which equal the real kernels on the
H100). Any mismatch of a tensor or a LayerConfig string fails."""

from __future__ import annotations

import subprocess
import sys

from conftest import MOEPACK, ROOT


def test_humming_random_shapes_equal_hummings_own_transform(tmp_path):
    script = ROOT / "bench" / "humming" / "check_random_shapes.py"
    r = subprocess.run([sys.executable, str(script), MOEPACK, "23", "12", str(tmp_path)],
                       capture_output=True, text=True, timeout=900)
    print(r.stdout[-4000:])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    ok = int(last.split()[1])
    assert last.startswith("ok ") and " bad 0 " in last and ok >= 10, last


def test_humming_parallel_ranks_equal_hummings_own_transform_of_each_rank_slice(tmp_path):
    """Every rank of `convert --tensor-parallel-size N` / `--expert-parallel N` (humming, the
    sm90 default) against humming's own transform of that rank's slice of the source, narrowed
    as vLLM 0.33's loader narrows it (bench/humming/check_parallel_shapes.py, independent of
    moepack's split): tensors byte for byte, LayerConfig strings, and the recode decision each
    rank makes on its own slice (sources crafted so that ranks decide differently)."""
    script = ROOT / "bench" / "humming" / "check_parallel_shapes.py"
    r = subprocess.run([sys.executable, str(script), MOEPACK, "25", "10", str(tmp_path)],
                       capture_output=True, text=True, timeout=900)
    print(r.stdout[-6000:])
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1].split()
    fields = dict(zip(last[0::2], (int(v) for v in last[1::2])))
    assert fields["bad"] == 0 and fields["ok"] >= 8, last
    assert fields["split"] >= 1, f"no trial whose ranks decided differently: {last}"
