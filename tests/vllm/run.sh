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
# The documented install (README, docs/vllm.md): `pip install ./integrations/vllm`, a regular
# (non-editable) install of this checkout's plugin; --no-build-isolation takes setuptools from the
# venv (no network). The venv is shared by every checkout on the machine, so the install holds a
# lock and is then checked while the lock is held: the installed package is this checkout's
# files, its vLLM plugin entry point and its console script are there, and the script runs from
# the installed copy.
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
exec 9>"$venv/.moepack-vllm-install.lock"
flock 9
(cd "$root" && rm -rf integrations/vllm/build &&
  "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation ./integrations/vllm)
diff -r -x __pycache__ "$root/integrations/vllm/moepack_vllm" "$site/moepack_vllm" ||
  { echo "FAIL: the installed moepack_vllm differs from $root/integrations/vllm"; exit 1; }
env -u PYTHONPATH "$venv/bin/python" - <<'PY' || { echo "FAIL: the installed plugin"; exit 1; }
import importlib.metadata as m
assert any(e.name == "moepack" and e.value == "moepack_vllm:register"
           for e in m.entry_points(group="vllm.general_plugins")), "no vllm.general_plugins entry"
PY
env -u PYTHONPATH "$venv/bin/moepack-vllm" check --help >/dev/null ||
  { echo "FAIL: the installed moepack-vllm script does not run"; exit 1; }
flock -u 9
exec 9>&-
# The tests import this checkout's plugin whatever another checkout installs meanwhile (the entry
# point and the script name the module, which PYTHONPATH then finds here first, in every process
# vLLM starts).
export PYTHONPATH="$root/integrations/vllm${PYTHONPATH:+:$PYTHONPATH}"
cd "$here"
MOEPACK_BIN=$bin exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning .
