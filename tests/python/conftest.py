# SPDX-License-Identifier: MIT
"""Shared helpers of the Python binding's tests: the package from python/
of this tree, the library from build/ (or $KVPULL_LIB), and kvpull-plan
(build/tools/, or $KVPULL_PLAN) run as the reference for what the C API
gives."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

import kvpull  # noqa: E402

TOOL = os.environ.get("KVPULL_PLAN") or os.path.join(REPO, "build", "tools",
                                                     "kvpull-plan")


def run_tool(*args, check=True):
    """Run kvpull-plan with args; return (exit status, stdout, stderr)."""
    if not os.access(TOOL, os.X_OK):
        pytest.fail("%s is not built: run make" % TOOL)
    p = subprocess.run([TOOL, "--no-timing", *map(str, args)],
                       capture_output=True, text=True, cwd=REPO)
    if check and p.returncode:
        pytest.fail("kvpull-plan %s: exit %d: %s" % (
            " ".join(map(str, args)), p.returncode, p.stderr))
    return p.returncode, p.stdout, p.stderr


def tool_json(*args):
    """kvpull-plan --json's document for args."""
    return json.loads(run_tool("--json", *args)[1])


def tool_text(*args):
    """kvpull-plan's summary for args."""
    return run_tool(*args)[1]


def layouts(model, local_tp=1, rank=0, remote_tp=1, local_block=16,
            remote_block=16, local_kernel=0, remote_kernel=0,
            local_layout="flash_hnd", remote_layout="flash_hnd",
            local_conv="ds", remote_conv="ds", num_blocks=1024):
    """The two layouts kvpull-plan builds for these options (its defaults:
    engine id 0, 1024 blocks, 16-token blocks, flash_hnd) and the options
    that make it build them."""
    loc = kvpull.Layout.build(
        model, tp_size=local_tp, tp_rank=rank, block_tokens=local_block,
        kernel_block_tokens=local_kernel, num_blocks=num_blocks,
        kv_layout=local_layout, conv_layout=local_conv)
    rem = kvpull.Layout.build(
        model, tp_size=remote_tp, tp_rank=0, block_tokens=remote_block,
        kernel_block_tokens=remote_kernel, num_blocks=num_blocks,
        kv_layout=remote_layout, conv_layout=remote_conv)
    args = ["--model", model, "--local-tp", local_tp, "--rank", rank,
            "--remote-tp", remote_tp, "--local-block", local_block,
            "--remote-block", remote_block, "--local-layout", local_layout,
            "--remote-layout", remote_layout, "--local-conv-layout",
            local_conv, "--remote-conv-layout", remote_conv,
            "--num-blocks", num_blocks]
    if local_kernel:
        args += ["--local-kernel-block", local_kernel]
    if remote_kernel:
        args += ["--remote-kernel-block", remote_kernel]
    return loc, rem, args


@pytest.fixture
def llama8b_pair():
    """llama-3.1-8b, producer TP 2 -> consumer TP 1 (the tool's layouts)."""
    loc, rem, _ = layouts("llama-3.1-8b", remote_tp=2)
    yield loc, rem
    loc.close()
    rem.close()
