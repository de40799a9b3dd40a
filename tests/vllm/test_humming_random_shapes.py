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
