#!/usr/bin/env bash
# Creates the virtual environment for the vLLM integration tests (tests/vllm) and for serving:
# the real vllm==0.33.0 from PyPI, its requirements, pytest, and this checkout's plugin installed
# by the documented command, `pip install ./integrations/vllm` (README, docs/vllm.md).
#
#   integrations/vllm/setup_test_venv.sh [VENV_DIR]
#
# VENV_DIR defaults to $MOEPACK_VLLM_VENV, else ~/.cache/moepack/venv-vllm-0.33.0: outside the
# checkout, so every clone on the machine (CI's included) reuses one ~9 GB venv. tests/vllm/run.sh
# installs the checkout's own integrations/vllm into it the same way before each run.
#
# vllm 0.33.0's wheel pins certifi>=2026.10.19, newer than PyPI serves at the time of writing,
# so the wheel is installed with --no-deps and then its requirements, read from its own
# metadata (extras dropped), with that one pin relaxed. PyPI's torch is the CUDA build; the tests
# run it on the CPU. Idempotent: a venv whose vllm is 0.33.0 and imports is reused (the plugin is
# installed again). When PyPI cannot be reached or an install of vLLM fails, it removes the
# half-made venv, says SKIP and exits 0, and the tests skip saying so.
set -euo pipefail
venv=${1:-${MOEPACK_VLLM_VENV:-$HOME/.cache/moepack/venv-vllm-0.33.0}}
vllm_version=0.33.0
root=$(cd "$(dirname "$0")/../.." && pwd)

# The plugin, by the documented command (from the checkout's root).
install_plugin() {
  # pip builds it in an isolated environment with setuptools from PyPI; offline that fails, and
  # tests/vllm/run.sh installs it again (with the venv's setuptools) before each run anyway.
  if (cd "$root" && "$venv/bin/pip" install -q --disable-pip-version-check ./integrations/vllm); then
    echo "setup_test_venv: moepack-vllm installed in $venv ($venv/bin/moepack-vllm)"
  else
    echo "setup_test_venv: WARNING: pip install ./integrations/vllm failed (offline?);" \
         "add --no-build-isolation to use the venv's setuptools" >&2
  fi
}

if [ -x "$venv/bin/python" ] &&
   "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm') != '$vllm_version')" 2>/dev/null &&
   "$venv/bin/python" -c "import pytest, safetensors, torch, vllm" 2>/dev/null; then
  echo "setup_test_venv: reusing $venv (vllm $vllm_version)"
  install_plugin
  exit 0
fi

fail() {
  echo "setup_test_venv: SKIP: $1; the vLLM tests (tests/vllm) will skip" >&2
  rm -rf "$venv"
  exit 0
}

rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv" || fail "python3 -m venv failed"
pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input -q)
"${pip[@]}" install --no-deps "vllm==$vllm_version" || fail "vllm==$vllm_version not installable from PyPI"
"$venv/bin/python" - >"$venv/vllm-requirements.txt" <<'PY' || fail "cannot read vllm's requirements"
import importlib.metadata as m
for req in m.requires("vllm") or []:
    if "extra ==" in req:
        continue
    if req.split(";")[0].replace(" ", "").startswith("certifi"):
        req = "certifi"  # the wheel's pin is newer than PyPI serves
    print(req)
PY
"${pip[@]}" install -r "$venv/vllm-requirements.txt" pytest || fail "vllm's requirements not installable"
"$venv/bin/python" -c "import vllm; print('setup_test_venv: vllm', vllm.__version__, 'in $venv')" ||
  fail "vllm does not import"
install_plugin
