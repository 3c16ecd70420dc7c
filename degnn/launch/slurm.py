"""cluster=slurm: the nodes of the Slurm allocation the launcher runs in, processes started by srun.

Run the launcher inside an allocation (`sbatch -N 2 job.sh`, or under `salloc -N 2`): the
machines are SLURM_JOB_NODELIST's nodes in its order, at the NodeAddr Slurm reaches them by
(degnn/runtime/cluster.py, `slurm_nodes`), one partition per node. Every server and trainer is
one job step of its own, `srun --nodes=1 --ntasks=1 --nodelist=<node> --overlap ... <cmd>`
(`--overlap`: the steps of one node share its resources, as the processes of a DGL machine do),
named `degnn-<launcher pid>-<process>` (`squeue --steps` lists them). srun passes the
launcher's environment on (the process's own variables included) and starts the process in the
launcher's working directory: the run directory, partitions and dataset must be on a file system
every node sees at the same path, as with cluster=ssh.

Stopping goes through Slurm: srun answers the launcher's SIGTERM by having slurmd kill its step's
process on the node (SIGKILL); steps of this launcher still known to Slurm once the grace period
is over are cancelled with `scancel --signal=KILL`. `scancel` of the job (or its time limit)
signals every step, the launcher's own included; a launcher that dies takes its srun processes
with it, and Slurm ends the steps of an srun that is gone (in a batch script the job ends too).
Sweeps (`-m`) run one cluster after another inside the one allocation.

Before anything starts, one step per node runs cluster=ssh's host check (ssh.CHECK): the
interpreter imports degnn, dgl and hydra there, reads the partition and ip_config files, and
names the interface that routes to the first node, which is every trainer's GLOO_SOCKET_IFNAME on
that node (`cluster.ifname` overrides).
"""
from __future__ import annotations

import os
import subprocess
from typing import Dict, List, Optional, Sequence

from degnn.runtime.cluster import slurm_nodes  # noqa: F401  (slurm.slurm_nodes)

from .plan import LaunchError, Proc
from .ssh import CHECK


def step_prefix(pid: Optional[int] = None) -> str:
    """The step name every step of this launcher's runs starts with."""
    return f"degnn-{os.getpid() if pid is None else pid}-"


def srun_base(node: str, name: str) -> List[str]:
    """srun of one task on `node` as a step of the allocation, named `name`; the task gets the
    environment srun was started with."""
    return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap",
            f"--job-name={name}", "--export=ALL", "--quiet", "--unbuffered"]


def with_env(argv: Sequence[str], env: Optional[Dict[str, str]]) -> List[str]:
    """`env K=V ... argv` where there is something to add (srun's own --export=ALL,K=V cannot
    carry a value with a comma)."""
    return ["env", *(f"{k}={v}" for k, v in env.items()), *argv] if env else list(argv)


def srun_argv(proc: Proc, node: str, *, env: Optional[Dict[str, str]] = None,
              pid: Optional[int] = None) -> List[str]:
    """`env`: variables added to the launcher's environment on the node."""
    return [*srun_base(node, step_prefix(pid) + proc.name), *with_env(proc.argv, env)]


def check_nodes(nodes: Sequence[str], python: str, files: Sequence[str], *, probe: str,
                ifname: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                timeout: float = 120) -> Dict[str, str]:
    """On every node at once (one step each): `python` imports degnn, dgl and hydra and reads
    `files`; else one line naming the node and the fix (LaunchError). Returns the interface gloo
    binds on every node: `ifname` where given (it exists there), else the one that routes to
    `probe` ("" where none is found)."""
    running = {}
    for node in dict.fromkeys(nodes):
        argv = [*srun_base(node, f"{step_prefix()}check"),
                *with_env([python, "-c", CHECK, probe, ifname or "", *files], env)]
        running[node] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True)
    found: Dict[str, str] = {}
    failed = None
    for node, p in running.items():
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            failed = failed or (f"node {node}: the check step did not end within {timeout:.0f}s; "
                                f"`squeue --steps` shows whether Slurm started it")
            continue
        if p.returncode == 0:
            said = [l.split(" ", 1) for l in out.splitlines() if l.startswith("ifname")]
            found[node] = said[-1][1].strip() if said and len(said[-1]) == 2 else ""
            continue
        lines = [l for l in (err or out).strip().splitlines() if l.strip()]
        own = [l for l in lines if not l.startswith("srun: ")]
        why = (own or lines or [f"exit code {p.returncode}"])[-1]
        if why.startswith("srun: "):
            failed = failed or f"node {node}: {why}; check the allocation (`squeue -j $SLURM_JOB_ID`)"
        elif why.startswith("cannot read"):
            failed = failed or (f"node {node}: {why}; the run directory and partitions must be on "
                                f"a file system every node sees at the same path")
        elif why.startswith("no network interface"):
            failed = failed or (f"node {node}: {why}; set cluster.ifname to an interface every "
                                f"node has, or leave it unset (per node: the one that routes to "
                                f"{probe})")
        else:
            failed = failed or (f"node {node}: {python}: {why}; install degnn there (same path) "
                                f"or set cluster.python=<an interpreter that has degnn, dgl and "
                                f"hydra>")
    if failed:
        raise LaunchError(failed)
    return found


def our_steps(job: str, prefix: str) -> List[str]:
    """Ids (<job>.<step>) of the job's steps whose name starts with `prefix`."""
    try:
        r = subprocess.run(["squeue", "--noheader", "--steps", f"--jobs={job}", "--format=%i %j"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    out = []
    for line in r.stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].strip().startswith(prefix):
            out.append(parts[0])
    return out


def cancel_steps(job: str, prefix: str, sig: str = "KILL") -> List[str]:
    """`scancel --signal=<sig>` of this launcher's steps still known to Slurm; returns their ids."""
    steps = our_steps(job, prefix)
    if steps:
        try:
            subprocess.run(["scancel", "--quiet", f"--signal={sig}", *steps],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return steps


def job_state(job: str) -> Optional[str]:
    """The job's JobState (RUNNING, CANCELLED, TIMEOUT, ...), None where Slurm does not say."""
    try:
        r = subprocess.run(["scontrol", "show", "job", "--oneliner", job], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = dict(f.split("=", 1) for f in r.stdout.split() if "=" in f)
    return fields.get("JobState")


def ended_note(job: str) -> str:
    """`Slurm job <id> is CANCELLED (...)`: why the processes died, where the job is no longer
    running (scancel, its time limit); "" while it runs."""
    state = job_state(job)
    if state in (None, "RUNNING"):
        return ""
    why = {"CANCELLED": "scancel ended it", "TIMEOUT": "its time limit ended it",
           "PREEMPTED": "it was preempted", "NODE_FAIL": "a node failed"}.get(
        state, "it no longer runs: scancel, its time limit or Slurm ended it")
    return f"Slurm job {job} is {state} ({why}); "


def job_id(environ: Optional[Dict[str, str]] = None) -> str:
    environ = os.environ if environ is None else environ
    job = environ.get("SLURM_JOB_ID")
    if not job:
        raise LaunchError("cluster=slurm runs inside a Slurm allocation and SLURM_JOB_ID is not set")
    return job
