"""`make demo`: the baseline trained on the embedded default dataset on a 2-machine cluster.

Builds the synthetic-tiny dataset (offline, OGB layout, read back by ogb's loader), partitions
it (METIS, 2 parts), starts two machines as network namespaces on this host (one graph server
and one trainer each) and prints the result line. Without permission for network namespaces it
falls back to one machine (cluster=local) and says so.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

DEMO = ["pipeline=distdgl", "dataset=synthetic-tiny", "model=sage", "train.epochs=20", "train.lr=0.01",
        "train.batch_size=128"]


def netns_permitted() -> bool:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        return False
    probe = f"degnn-probe-{uuid.uuid4().hex[:6]}"
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ok


def main() -> int:
    if netns_permitted():
        cluster = ["cluster=netns", "cluster.machines=2"]
        print("degnn demo: 2 machines (network namespaces on this host), DistDGL baseline, synthetic-tiny",
              flush=True)
    else:
        cluster = ["cluster=local"]
        print("degnn demo: network namespaces are not permitted here (needs root and iproute2); "
              "falling back to cluster=local (one machine)", flush=True)
    cmd = [sys.executable, "-m", "degnn.launch", *DEMO, *cluster, *sys.argv[1:]]
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
