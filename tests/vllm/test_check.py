"""`moepack-vllm check` (moepack_vllm/check.py) against the plugin that imports vLLM: its list of
kernel builders is the plugin's, and the console script is installed with the package."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys


def test_check_knows_every_kernel_builder_the_plugin_registers():
    # In a child process: importing moe.py registers the "moepack" quantization method in vLLM,
    # which would make the stock-vLLM refusal tests of this session (test_serving.py) see it.
    probe = ("import json; from moepack_vllm import check, moe; "
             "print(json.dumps([sorted(check.KERNEL_BUILDER_NAMES), sorted(moe.KERNEL_BUILDERS)]))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    names_in_check, names_in_moe = json.loads(out.stdout.strip().splitlines()[-1])
    assert names_in_check == names_in_moe


def test_console_script_is_installed():
    scripts = {e.name: e.value for e in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts.get("moepack-vllm") == "moepack_vllm.check:main"
