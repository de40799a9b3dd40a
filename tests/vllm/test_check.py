"""`moepack-vllm check` (moepack_vllm/check.py) against the plugin that imports vLLM: its list of
kernel builders is the plugin's, and the console script is installed with the package."""

from __future__ import annotations

import importlib.metadata


def test_check_knows_every_kernel_builder_the_plugin_registers():
    from moepack_vllm import check, moe

    assert set(check.KERNEL_BUILDER_NAMES) == set(moe.KERNEL_BUILDERS)


def test_console_script_is_installed():
    scripts = {e.name: e.value for e in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts.get("moepack-vllm") == "moepack_vllm.check:main"
