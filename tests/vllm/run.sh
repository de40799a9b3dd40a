#!/usr/bin/env bash
# ctest entry `vllm_serving`: the vLLM integration tests in the test-only venv.
#   tests/vllm/run.sh MOEPACK_BIN [VENV]
# Without the venv (integrations/vllm/setup_test_venv.sh makes it) it says SKIP and exits 77
# (ctest: skipped).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=$1
venv=${2:-${MOEPACK_VLLM_VENV:-$HOME/.cache/moepack/venv-vllm-0.33.0}}
if ! [ -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import vllm, pytest" 2>/dev/null; then
  echo "SKIP: vLLM integration tests: no venv with vllm==0.33.0 at $venv" \
       "(run integrations/vllm/setup_test_venv.sh)"
  exit 77
fi
# This checkout's plugin, editable (no network: setuptools comes from the venv).
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
  -e "$root/integrations/vllm" >/dev/null
cd "$here"
MOEPACK_BIN=$bin exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning .
