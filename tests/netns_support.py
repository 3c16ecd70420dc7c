"""Whether this machine can run cluster=netns, for the tests that start real netns clusters."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def netns_reason():
    """None when network namespaces work here, else why not (the skip reason)."""
    if os.geteuid() != 0:
        return "cluster=netns needs root"
    if not all(shutil.which(t) for t in ("ip", "nsenter", "unshare")):
        return "ip/nsenter/unshare not installed"
    name = f"degnnprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        return f"network namespaces not permitted here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


REASON = netns_reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=str(REASON))
