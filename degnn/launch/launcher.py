"""One cluster job: preflight, build the machines, run the plan, add wire counters, report.

`launch()` is what the Hydra entry (`python -m degnn.launch`) calls once per job; it takes the
partition JSON as an argument so that tests can hand it a prebuilt partition.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from .limits import MachineLimits
from .memory import graph_keys, part_bytes
from .netns import NetnsCluster
from degnn.metrics import progress_of, result_line, write_json_atomic
from degnn.runtime.cluster import machines_of

from .plan import (DEFAULT_ENTRY, LaunchError, Plan, absolute_overrides, build_plan, entry_argv,
                   read_part_config)
from .cleanup import cleanup_all
from .isolate import PrivateMachine, SharedShmLock, can_isolate
from .preflight import check_config
from .faults import disk_note
from .hang import STOPPED_LIMIT_S
from .shm import check_shm
from .supervisor import Signals, Supervisor
from . import slurm, ssh


# where say() also writes once a run directory exists (<run dir>/launch.log: the fault message
# stays with the run)
_log_path: Optional[str] = None


def say(msg: str) -> None:
    line = f"degnn.launch: {msg}"
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError, RuntimeError):
        # the terminal is gone (SIGHUP), or a signal's line interrupted another: launch.log has it
        pass
    if _log_path:
        try:
            with open(_log_path, "a") as f:
                f.write(f"{time.strftime('%H:%M:%S')} {line}\n")
        except OSError:
            pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_ports_free(host: str, ports: Sequence[int]) -> None:
    for port in ports:
        with socket.socket() as s:
            # as the servers bind: connections of an earlier run in TIME_WAIT do not count
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                raise LaunchError(
                    f"port {port} on {host} is in use ({e.strerror}): a server left from an earlier "
                    f"run? stop it or pick another cluster.port")


def make_plan(cfg, run_dir: str, part_config: str, task_overrides: Sequence[str],
              entry: str = DEFAULT_ENTRY, master_port: Optional[int] = None,
              ifname: Optional[str] = None) -> Plan:
    """Preflight checks that need no machine, then the plan (pure apart from reading files)."""
    check_config(cfg)
    cl = cfg.cluster
    machines = machines_of(cl)
    # a dry run before the partitions are built plans the ones a real run builds (one per machine)
    unbuilt = cl.dry_run and not Path(part_config).exists()
    num_parts = int(cfg.partition.num_parts) if unbuilt else read_part_config(part_config)
    if num_parts != len(machines):
        src = {"ssh": cl.ip_config, "slurm": "the Slurm allocation's nodes"}.get(
            cl.kind, f"cluster.machines={cl.machines}")
        raise LaunchError(f"{len(machines)} machines ({src}) but {num_parts} partitions in "
                          f"{part_config}: one partition per machine")
    run_dir = os.path.abspath(run_dir)
    overrides = absolute_overrides(task_overrides, run_dir, cfg.dataset.root, cfg.partition.root)
    # ssh: the launcher's own interpreter (the same paths on every host are assumed anyway:
    # `python3` on a remote PATH is rarely the venv that has degnn); cluster.python overrides
    remote = cl.kind in ("ssh", "slurm")
    python = (cl.get("python") or sys.executable) if remote else None
    if master_port is None:
        master_port = cl.port - 1 if remote else free_port()
    if ifname is None and cl.kind == "netns":
        from .netns import IFNAME
        ifname = IFNAME
    if ifname is None and remote:
        # unset: found per host by the preflight (ssh.check_hosts, slurm.check_nodes)
        ifname = cl.get("ifname") or None
    return build_plan(machines, trainers_per_machine=cl.trainers_per_machine,
                      servers_per_machine=cl.servers_per_machine, part_config=part_config,
                      ip_config=os.path.join(run_dir, "ip_config.txt"), run_dir=run_dir,
                      argv=entry_argv(overrides, entry, python), master_port=master_port,
                      ifname=ifname)


def finalize_summary(run_dir: str, start: Optional[List[Tuple[int, int]]],
                     end: Optional[List[Tuple[int, int]]],
                     dead_trainers: Optional[List[int]] = None,
                     extra: Optional[dict] = None) -> Optional[dict]:
    """Add the wire counters to rank 0's summary.json (null outside netns), the ranks of
    trainers that died in a run that went on without them (`trainers_died`) and `extra` (every
    process's peak RSS, the machines' limits: `launcher_keys`)."""
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
    except ValueError:
        say(f"{path} is not valid JSON; wire counters not added")
        return None
    if dead_trainers:
        summary["trainers_died"] = sorted(dead_trainers)
    summary.update(extra or {})
    if start is not None and end is not None:
        tx = [e[0] - s[0] for s, e in zip(start, end)]
        rx = [e[1] - s[1] for s, e in zip(start, end)]
        total = sum(tx)
        batches = summary.get("batches") or 0
        summary.update(net_bytes_total=total, net_tx_bytes_per_machine=tx, net_rx_bytes_per_machine=rx)
        # the trainers' own count covers the training phase only (no start-up, no evaluation);
        # the whole run's bytes per batch is the fallback where they could not read the wire
        if summary.get("net_bytes_per_batch") is None:
            summary["net_bytes_per_batch"] = (total / batches) if batches else None
    else:
        for k in ("net_bytes_total", "net_bytes_per_batch", "net_tx_bytes_per_machine",
                  "net_rx_bytes_per_machine"):
            summary.setdefault(k, None)
    if not write_summary_file(path, summary, "rank 0's summary stays as it was, without them"):
        return None
    return summary


def write_summary_file(path: Path, summary: dict, otherwise: str) -> bool:
    """summary.json in one piece (a temporary file renamed into place: never empty or half
    written); False, with one line naming the problem, where it cannot be written."""
    try:
        write_json_atomic(path, summary)
        return True
    except OSError as e:
        say(f"{path} not written ({e.strerror or e}){disk_note(str(path.parent))}; {otherwise}")
        return False


def write_failure(run_dir: str, cfg, message: str, failed=None, machines=None,
                  trainers=None, extra: Optional[dict] = None,
                  dead_trainers: Optional[List[int]] = None) -> dict:
    """summary.json of a run that did not finish: status failed, and why (benchmarks read it);
    the ranks of trainers that died before it failed (`trainers_died`: a tolerant pipeline's,
    every one of them where none was left), as a finished run's summary has them."""
    path = Path(run_dir) / "summary.json"
    summary = {}
    if path.is_file():
        try:
            summary = json.loads(path.read_text())
        except ValueError:
            pass
    base = {"pipeline": cfg.pipeline.name, "variant": cfg.pipeline.get("variant"),
            "dataset": cfg.dataset.name, "machines": machines, "trainers": trainers,
            "net_bytes_total": None, "net_bytes_per_batch": None}
    # a pipeline that stopped itself (e.g. diverged) wrote why; that is the error to report
    own = summary.get("error") if summary.get("status") == "failed" else None
    summary = {**base, **summary, **(extra or {}), "status": "failed", "error": own or message}
    if own and own != message:
        summary["stopped_by"] = message
    for k, v in progress_of(run_dir).items():  # the epochs done stay in the summary
        if summary.get(k) is None:
            summary[k] = v
    if dead_trainers:
        summary["trainers_died"] = sorted(dead_trainers)
    if failed is not None:
        summary["failed_process"] = {"role": failed.role, "index": failed.index,
                                     "machine": failed.machine, "log": failed.log}
    write_config_if_missing(run_dir, cfg)
    write_summary_file(path, summary, "the run's status is in this output and launch.log; "
                                      "curve.jsonl and checkpoints already written are kept")
    return summary


def write_config_if_missing(run_dir: str, cfg) -> None:
    """The launcher's composed config.yaml where rank 0 never wrote its own (a run that failed
    while starting): reports and records read a run's settings from it."""
    path = Path(run_dir) / "config.yaml"
    if path.exists():
        return
    try:
        from omegaconf import OmegaConf

        path.write_text(OmegaConf.to_yaml(cfg))
    except Exception as e:  # noqa: BLE001 - the failure summary matters more than its config
        say(f"could not write {path} ({e})")


def tolerates_trainer_faults(cfg) -> bool:
    """The pipeline's fault policy (Pipeline.tolerates_trainer_faults); False where its class
    cannot be imported here (a test's own entry)."""
    from degnn.pipelines import pipeline_class

    try:
        return bool(pipeline_class(cfg).tolerates_trainer_faults)
    except ValueError:
        return False


def launch(cfg, run_dir: str, part_config: str, task_overrides: Sequence[str],
           entry: str = DEFAULT_ENTRY, out=None) -> int:
    """Run one cluster job; returns the launcher's exit status (0 = every trainer exited 0, or,
    for a pipeline that tolerates trainer faults, at least one trainer exited 0).

    Raises LaunchError (one-line message) for anything wrong before a process starts."""
    out = out or sys.stdout
    cl = cfg.cluster
    run_dir = os.path.abspath(run_dir)
    plan = make_plan(cfg, run_dir, part_config, task_overrides, entry)
    if cl.dry_run:
        print(plan.render(), file=out, flush=True)
        if not Path(part_config).exists():
            print(f"partitions: {part_config} (not built yet: a real run builds it first)", file=out,
                  flush=True)
        return 0
    # a /dev/shm too small for a part kills its server with a bare SIGBUS: refused here instead
    check_shm(cl.kind, cl.kind == "netns" or (cl.kind == "local" and isolated(cl)), part_config,
              [[m] for m in range(len(plan.machines))])
    if cl.kind == "local" and not isolated(cl):  # a private machine has ports of its own
        check_ports_free(plan.machines[0][0],
                         [plan.machines[0][1] + j for j in range(cl.servers_per_machine)])
    # leftovers of launchers that are gone (SIGKILLed), their half-written partitions included
    for what in cleanup_all(partition_roots=[cfg.partition.root]):
        say(f"removed {what}")
    try:
        os.makedirs(run_dir, exist_ok=True)
        # a summary left by an earlier run in this directory (resume into it) must not be merged
        # into this run's failure summary
        Path(run_dir, "summary.json").unlink(missing_ok=True)
        shutil.rmtree(os.path.join(run_dir, "heartbeat"), ignore_errors=True)  # an earlier run's
        plan.write_ip_config()
    except OSError as e:
        raise LaunchError(f"hydra.run.dir={run_dir}: cannot write the run directory "
                          f"({e.strerror or e}){disk_note(run_dir)}") from None
    global _log_path
    _log_path = os.path.join(run_dir, "launch.log")
    # SIGINT, SIGTERM, SIGHUP anywhere (also while the machines are built or torn down) unwind
    # like Ctrl-C, so the clean-up in finally/with blocks runs; later ones do not cut it short
    signals = Signals(say).install()
    try:
        rc = _run(cfg, plan, run_dir, out, signals)
        return signals.returncode or rc
    finally:
        _log_path = None
        signals.restore()


def isolated(cluster) -> bool:
    """Whether this cluster=local run gets a private machine (cluster.isolate, default: if it can)."""
    want = cluster.get("isolate")
    if want is None:
        return can_isolate()
    if want and not can_isolate():
        raise LaunchError("cluster.isolate=true needs root and unshare, nsenter and ip "
                          "(iproute2); set cluster.isolate=false to share the host's /dev/shm")
    return bool(want)


def _graph_name(plan: Plan) -> Optional[str]:
    try:
        return json.loads(Path(plan.procs[0].env["DGL_CONF_PATH"]).read_text())["graph_name"]
    except (OSError, ValueError, KeyError, IndexError):
        return None


def partition_keys(plan: Plan) -> dict:
    """The partitioner's own numbers from the run's stats.json (written when the partition was
    built, by whichever launch built it): `partition_s` (assignment and writing), `partition_load_s`
    (the dataset's load or build), `partition_peak_rss_mb` (the partitioning process's peak), and
    what the partition is: `partition_edge_cut_fraction`, `graph_digest` and `partition_digest`
    (hashes of the graph and of the node assignment: runs with the same digests ran on the same
    data and parts), `partition_streamed` (true for random parts cut in passes over a chunked
    graph); None for a partition without them (one made elsewhere: partition.path, or
    one built before the digests were recorded)."""
    try:
        stats = json.loads((Path(plan.procs[0].env["DGL_CONF_PATH"]).parent / "stats.json").read_text())
    except (OSError, ValueError, KeyError, IndexError):
        stats = {}
    return {"partition_s": stats.get("wall_time_s"), "partition_load_s": stats.get("load_time_s"),
            "partition_peak_rss_mb": stats.get("peak_rss_mb"),
            "partition_edge_cut_fraction": stats.get("edge_cut_fraction"),
            "graph_digest": stats.get("graph_digest"), "partition_digest": stats.get("assignment_digest"),
            "partition_streamed": stats.get("streamed")}


def launcher_keys(sup: Supervisor, limits: MachineLimits, plan: Plan) -> dict:
    """The launcher's summary keys of memory: every process's peak RSS (servers included;
    `peak_rss_mb_server` their largest) and, where its pid is on this host (local, netns), peak
    PSS and USS; with machine limits the limits, each machine's peak (its cgroup's max usage)
    and its split; the graph's share of a machine and, with memory limits, each machine's peak
    against it (memory.graph_keys)."""
    peaks = sup.peaks_mb()
    servers = [v for k, v in peaks.items() if k.startswith("server") and v is not None]
    sets = sup.sets_mb()
    out = {"peak_rss_mb_per_process": peaks or None,
           "peak_rss_mb_server": max(servers) if servers else None,
           "peak_pss_mb_per_process": sets.get("pss"), "peak_uss_mb_per_process": sets.get("uss")}
    if limits.dirs:
        out.update(limits.summary())
    machine_peaks = ([limits.peak_bytes(i) for i in range(limits.k)] if "memory" in limits.dirs
                     else None)
    try:
        parts = part_bytes(plan.procs[0].env["DGL_CONF_PATH"])
    except (KeyError, IndexError):
        parts = None
    out.update(graph_keys(parts, machine_peaks))
    return out


def _run(cfg, plan: Plan, run_dir: str, out, signals: Signals) -> int:
    cl = cfg.cluster
    cwd = os.getcwd()
    with ExitStack() as stack:
        command: Callable = lambda p: p.argv
        on_stop = on_kill = None
        counters = None
        limits = MachineLimits(len(plan.machines), cl.get("memory_per_machine"),
                               cl.get("cpus_per_machine"), bool(cl.get("memory_accounting")))
        if cl.kind == "netns":
            net = NetnsCluster(len(plan.machines), cl.subnet, cl.bandwidth)
            up = lambda: [f"netns machines {', '.join(net.ns)} and bridge {net.bridge}"]
            signals.leftovers.append(up)
            # registered first, so it runs after the cluster is down (last in, first out)
            stack.callback(lambda: say(f"netns cluster removed in {net.teardown_s:.2f}s"))
            stack.callback(signals.leftovers.remove, up)
            stack.enter_context(net)
            say(f"netns cluster of {net.k} machines up in {net.setup_s:.2f}s: "
                + ", ".join(f"{n}={ip}" for n, ip in zip(net.ns, net.ips))
                + (f", {cl.bandwidth} per link" if cl.bandwidth else ""))
            command = lambda p: [*net.prefix(p.machine, cwd), *p.argv]
            counters = net.counters
            if limits.active:
                stack.enter_context(limits)  # removed before the cluster (last in, first out)
                say(f"machine limits: {limits.describe()}")
        elif cl.kind == "local" and isolated(cl):
            machine = stack.enter_context(PrivateMachine())
            say("local machine in private network, /dev/shm and IPC namespaces "
                f"(holder pid {machine.holder.pid})")
            command = lambda p: [*machine.prefix(cwd), *p.argv]
        elif cl.kind == "local":
            stack.enter_context(SharedShmLock(run_dir, _graph_name(plan)))
        elif cl.kind == "ssh":
            forward = ssh.forwarded_env()
            master = plan.machines[0][0]
            ifnames = ssh.check_hosts(ssh.hosts_of(plan.machines), plan.procs[0].argv[0],
                                      [plan.procs[0].env["DGL_CONF_PATH"], plan.ip_config],
                                      probe=master, ifname=cl.get("ifname") or None,
                                      workspace=cl.workspace, port=cl.ssh_port, user=cl.ssh_user,
                                      env={"PYTHONPATH": plan.procs[0].env["PYTHONPATH"]})
            for host, name in ifnames.items():
                if not name:
                    say(f"host {host}: no interface holds the address it sends from towards "
                        f"{master}; gloo binds the address its host name resolves to (set "
                        f"cluster.ifname if its trainers cannot connect)")
            say("gloo interfaces: " + ", ".join(f"{h}={n or '?'}" for h, n in ifnames.items()))

            def command(p):
                host = plan.machines[p.machine][0]
                env = dict(forward)
                if p.role == "trainer" and ifnames.get(host):
                    env["GLOO_SOCKET_IFNAME"] = ifnames[host]  # a given cluster.ifname is in p.env
                return ssh.ssh_argv(p, host, workspace=cl.workspace, port=cl.ssh_port,
                                    user=cl.ssh_user, extra_env=env)

            def kill_remote():  # every command line carries -m <entry> ... hydra.run.dir=<run_dir>
                for host in ssh.hosts_of(plan.machines):
                    subprocess.run(ssh.kill_argv(host, run_dir, entry=plan.procs[0].argv[2],
                                                 port=cl.ssh_port, user=cl.ssh_user),
                                   stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
            on_stop = kill_remote
        elif cl.kind == "slurm":
            job = slurm.job_id()
            nodes = [name for name, _ in slurm.slurm_nodes()]
            master = plan.machines[0][0]
            ifnames = slurm.check_nodes(nodes, plan.procs[0].argv[0],
                                        [plan.procs[0].env["DGL_CONF_PATH"], plan.ip_config],
                                        probe=master, ifname=cl.get("ifname") or None,
                                        env={"PYTHONPATH": plan.procs[0].env["PYTHONPATH"]})
            say(f"Slurm job {job}, nodes " + ", ".join(f"{n}={ip}" for n, (ip, _) in
                                                       zip(nodes, plan.machines))
                + "; gloo interfaces: " + ", ".join(f"{n}={i or '?'}" for n, i in ifnames.items()))

            def command(p):
                node = nodes[p.machine]
                env = {"GLOO_SOCKET_IFNAME": ifnames[node]} if (
                    p.role == "trainer" and ifnames.get(node) and not cl.get("ifname")) else {}
                return slurm.srun_argv(p, node, env=env)

            on_kill = lambda: slurm.cancel_steps(job, slurm.step_prefix())
        start = counters() if counters else None
        sup = Supervisor(plan, command=command, on_stop=on_stop, on_kill=on_kill, cwd=cwd,
                         stop_grace_s=cl.stop_grace_s, hang_timeout_s=cl.hang_timeout_s,
                         console=getattr(out, "buffer", None), say=say,
                         tolerate_trainer_faults=tolerates_trainer_faults(cfg),
                         signals=signals, local_pids=cl.kind != "ssh",
                         tell_server_pids=cl.kind in ("local", "netns"),
                         # a process stopped by a signal is named within seconds; off with
                         # the hang timeout (cluster.hang_timeout_s=0: e.g. under a debugger)
                         stopped_limit_s=STOPPED_LIMIT_S if cl.hang_timeout_s else 0,
                         enter=(lambda p: limits.enter(p.machine)) if limits.dirs else None,
                         limits=limits if limits.dirs else None,
                         sample_sets=cl.kind in ("local", "netns"))
        signals.leftovers.append(lambda: [f"processes {', '.join(sup.left_running())}"]
                                 if sup.left_running() else [])
        say(f"{len(plan.procs)} processes ({len(plan.servers())} servers, "
            f"{len(plan.trainers())} trainers); logs in {run_dir}")
        outcome = sup.run()
        if cl.kind == "slurm" and not outcome.ok:
            outcome.message = slurm.ended_note(job) + outcome.message
        end = counters() if counters else None
        extra = {**launcher_keys(sup, limits, plan), **partition_keys(plan)}
        say(f"{len(plan.procs)} processes started in {outcome.started_s:.2f}s, "
            f"stopped in {outcome.stop_s:.2f}s")
    if not outcome.ok:
        failure = write_failure(run_dir, cfg, outcome.message, outcome.failed, len(plan.machines),
                                len(plan.trainers()), extra=extra,
                                dead_trainers=[p.index for p in outcome.dead_trainers])
        # the fault is the last line: what the stopped processes and the clean-up said is above
        say(f"run failed: {failure['error']}")
        return outcome.returncode if outcome.returncode and outcome.returncode > 0 else 1
    summary = finalize_summary(run_dir, start, end,
                               dead_trainers=[p.index for p in outcome.dead_trainers], extra=extra)
    if summary is None:
        say(f"trainers done, but rank 0 wrote no {run_dir}/summary.json")
    else:
        print(result_line(summary), file=out, flush=True)
    return 0
