"""How much of its nominal rate a netns link delivers to DistDGL's traffic pattern: the link
efficiency the projection divides bytes by (docs/benchmarks.md, "Link efficiency").

cluster=netns caps every machine's link with tc tbf (degnn/launch/netns.py: a 10 ms burst, a 50 ms
queue, both directions). A feature pull is several TCP flows at once (every machine asks every
other for its rows), and those flows do not get the nominal rate between them: they compete in the
senders' and receivers' queues, and the pull ends with its slowest flow. Transfers shorter than the
burst go faster than the rate. The projection (benchmarks.projection) turns bytes into seconds; at
the nominal rate it calls the missing time CPU, and that CPU then does not shrink at a faster link.
This measures the emulated links alone, with neither DGL nor degnn in the path:

    python -m benchmarks.link_probe [--bandwidths 100mbit,1gbit] [--machines 4]
        [--sizes 250000,1000000,4000000] [--rounds 8] [--repeats 3] [--records DIR]

builds a netns cluster per bandwidth, opens a TCP connection from every machine to every other,
then `rounds` times, every machine at the same moment asks each other machine for `size` bytes
and times until all of them arrived (the pull), with an idle gap between rounds (a trainer pulls,
then computes). Efficiency = size x (machines - 1) / rate / time: 1 is the nominal rate. Each
(bandwidth, size) of a repeat is one record in `benchmarks/records/network.jsonl` (bench
"network"); `python -m benchmarks.results_md` makes RESULTS.md's bench=network table from them
and the projection reads them (`efficiencies`). The CPU of the probe is small (no CPU budget):
it measures the link, not a machine.

    python -m benchmarks.link_probe serve SIZE | pull ...   (run inside the namespaces)
"""
from __future__ import annotations

import argparse
import json
import math
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

PORT = 29555
REQUEST = 16  # bytes of a request: the size asked for, as ASCII digits
SUBNET = "10.76.0"  # apart from the launcher's default, so that a probe never meets a cluster's
BANDWIDTHS = ("100mbit", "1gbit")  # the benches' links
SIZES = (250_000, 1_000_000, 4_000_000)  # bytes from each peer: wordnet's pull is about 1.6 MB


# --- inside the namespaces ---------------------------------------------------------------------
def serve(size: int) -> None:
    """Answer every request on PORT with the bytes it asks for (at most `size`), until killed."""
    payload = memoryview(b"\0" * size)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", PORT))
    srv.listen(64)

    def answer(conn: socket.socket) -> None:
        with conn:
            while True:
                req = conn.recv(REQUEST, socket.MSG_WAITALL)
                if len(req) < REQUEST:
                    return
                conn.sendall(payload[:int(req)])

    while True:
        conn, _ = srv.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=answer, args=(conn,), daemon=True).start()


def pull(me: int, peers: Sequence[str], size: int, rounds: int, start: float, gap_s: float) -> List[float]:
    """Seconds of each round's pull of `size` bytes from every peer at once, rounds starting at
    `start` + k * `gap_s` (wall clock: every machine of the host shares it)."""
    conns = []
    for host in peers:
        deadline = time.time() + 20
        while True:
            try:
                c = socket.create_connection((host, PORT), timeout=30)
                break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit(f"link_probe: machine {me} cannot reach {host}:{PORT}")
                time.sleep(0.05)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns.append((host, c))

    errors: List[str] = []

    def fetch(host: str, c: socket.socket) -> None:
        try:
            c.sendall(str(size).rjust(REQUEST).encode())
            left = size
            while left:
                chunk = c.recv(min(left, 1 << 20))
                if not chunk:
                    raise OSError("the peer closed its connection")
                left -= len(chunk)
        except OSError as e:  # a timeout too: the round's time would be a lie
            errors.append(f"{host}: {e}")

    times = []
    for k in range(rounds):
        time.sleep(max(0.0, start + k * gap_s - time.time()))
        t0 = time.perf_counter()
        threads = [threading.Thread(target=fetch, args=conn) for conn in conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise SystemExit(f"link_probe: machine {me} could not pull: {errors[0]}")
        times.append(time.perf_counter() - t0)
    return times


# --- from the host -------------------------------------------------------------------------------
def nominal_s(bandwidth: str, size: int, machines: int) -> float:
    from degnn.launch.netns import parse_rate

    return size * (machines - 1) / parse_rate(bandwidth)


def measure(bandwidth: str, size: int, machines: int = 4, rounds: int = 8) -> dict:
    """One (bandwidth, size) on a fresh netns cluster: every machine's pull times, their median,
    and the efficiency of the median (the first round, on connections still in TCP's slow start,
    is left out)."""
    from degnn.launch.netns import NetnsCluster

    nominal = nominal_s(bandwidth, size, machines)
    gap = max(0.3, 3 * nominal)  # the link idle between pulls, as between a trainer's batches
    cmd = [sys.executable, "-m", "benchmarks.link_probe"]
    from . import CHECKOUT

    cwd = str(CHECKOUT)  # `-m benchmarks.link_probe` is found there
    with NetnsCluster(machines, subnet=SUBNET, bandwidth=bandwidth) as cluster:
        servers = [subprocess.Popen(cluster.prefix(i, cwd) + cmd + ["serve", str(size)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(machines)]
        try:
            start = time.time() + 2.0  # every client connected by then
            clients = [subprocess.Popen(cluster.prefix(i, cwd) + cmd + [
                "pull", str(i), ",".join(ip for j, ip in enumerate(cluster.ips) if j != i), str(size),
                str(rounds + 1), repr(start), repr(gap)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for i in range(machines)]
            per_machine = []
            for p in clients:
                out, err = p.communicate(timeout=60 + (rounds + 1) * (gap + 20 * nominal))
                if p.returncode != 0:
                    raise SystemExit(f"link_probe: a pull failed at {bandwidth}: {err.strip()[-300:]}")
                per_machine.append(json.loads(out)[1:])
        finally:
            for p in servers:
                p.kill()
                p.wait()
    times = sorted(t for m in per_machine for t in m)
    median = statistics.median(times)
    return {"pipeline": "network", "status": "ok", "bandwidth": bandwidth, "machines": machines,
            "bytes_per_peer": size, "rounds": rounds, "nominal_s": round(nominal, 6),
            "pull_s_median": round(median, 6), "pull_s_min": round(times[0], 6), "pull_s_max": round(times[-1], 6),
            "efficiency": round(nominal / median, 4), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def suite_name(r: dict) -> str:
    return f"{r['bandwidth']}-{r['machines']}m-{r['bytes_per_peer'] // 1000}kB"


def record(results: List[List[dict]], records_dir: Path) -> Path:
    """The measurements (one list per repeat) as records of one invocation in network.jsonl."""
    from .records import append_measurements

    return append_measurements("network", [[(suite_name(r), r) for r in repeat] for repeat in results],
                               Path(records_dir))


# --- what the projection and the report read -----------------------------------------------------
class Efficiencies:
    """The measured efficiency of each bandwidth by bytes per peer (median over repeats);
    `at(rate, bytes_per_peer)` interpolates in log size between the probe's sizes and holds the
    end values beyond them; 1 for a bandwidth never probed (the projection's real links)."""

    def __init__(self, table: Dict[float, List[Tuple[float, float]]]):
        self.table = {rate: sorted(points) for rate, points in table.items()}

    @classmethod
    def from_runs(cls, runs: List[dict]) -> "Efficiencies":
        from degnn.launch.netns import parse_rate

        by: Dict[Tuple[float, float], List[float]] = {}
        for r in runs:
            if r.get("pipeline") == "network" and r.get("efficiency"):
                by.setdefault((parse_rate(r["bandwidth"]), float(r["bytes_per_peer"])), []).append(r["efficiency"])
        table: Dict[float, List[Tuple[float, float]]] = {}
        for (rate, size), effs in by.items():
            table.setdefault(rate, []).append((size, statistics.median(effs)))
        return cls(table)

    @classmethod
    def committed(cls, records_dir: Optional[Path] = None) -> "Efficiencies":
        """From the current records of the checkout's benchmarks/records/network.jsonl (else the
        none: every link nominal)."""
        from .records import RECORDS_DIR, as_run, current

        path = Path(records_dir or RECORDS_DIR) / "network.jsonl"
        if not path.is_file():
            return cls({})
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return cls.from_runs([as_run(r) for r in current(records)])

    def __bool__(self) -> bool:
        return bool(self.table)

    def at(self, rate: float, bytes_per_peer: float) -> float:
        points = next((p for r, p in self.table.items() if math.isclose(r, rate, rel_tol=1e-6)), None)
        if not points or bytes_per_peer <= 0:
            return 1.0
        if bytes_per_peer <= points[0][0]:
            return points[0][1]
        for (s0, e0), (s1, e1) in zip(points, points[1:]):
            if bytes_per_peer <= s1:
                f = math.log(bytes_per_peer / s0) / math.log(s1 / s0)
                return e0 + f * (e1 - e0)
        return points[-1][1]


def network_section(runs: List[dict]) -> List[str]:
    """RESULTS.md's bench=network table: every probed bandwidth and size over the repeats."""
    from .spread import cell, spread

    by: Dict[tuple, List[dict]] = {}
    for r in runs:
        if r.get("pipeline") == "network" and r.get("efficiency"):
            by.setdefault((r["bandwidth"], r["machines"], r["bytes_per_peer"]), []).append(r)
    if not by:
        return []
    from degnn.launch.netns import parse_rate

    rows = []
    for (bw, machines, size), rs in sorted(by.items(), key=lambda kv: (parse_rate(kv[0][0]), kv[0][2])):
        rows.append(f"| {bw} | {machines} | {size / 1e6:.2f} | {rs[0]['nominal_s'] * 1e3:.1f} | "
                    f"{cell(spread([r['pull_s_median'] * 1e3 for r in rs]), '.1f')} | "
                    f"{cell(spread([r['efficiency'] for r in rs]), '.2f')} | {len(rs)} |")
    return ["## Link efficiency of the netns links", "",
            "Every machine pulls the same number of bytes from each other machine at once over open TCP "
            "connections, idle between pulls (benchmarks.link_probe: DistDGL's feature pull without "
            "DGL). Pull ms: the median over rounds and machines; efficiency = the bytes at the nominal "
            "rate over that median (1 = the nominal rate; above 1: the tbf burst lets a short transfer "
            "through faster). Over repeats the median (min–max). The projection divides a netns run's "
            "bytes by its rate times this efficiency (interpolated in the bytes per peer).", "",
            "| bandwidth | machines | MB per peer | nominal ms | pull ms | efficiency | repeats |",
            "|---|---|---|---|---|---|---|", *rows, ""]


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        serve(int(argv[1]))
        return 0
    if argv[:1] == ["pull"]:
        me, peers, size, rounds, start, gap = argv[1:7]
        print(json.dumps(pull(int(me), peers.split(","), int(size), int(rounds), float(start), float(gap))))
        return 0
    from .records import RECORDS_DIR

    ap = argparse.ArgumentParser(prog="python -m benchmarks.link_probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bandwidths", default=",".join(BANDWIDTHS), help="tc rates, comma-separated")
    ap.add_argument("--machines", type=int, default=4)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="bytes from each peer, comma-separated")
    ap.add_argument("--rounds", type=int, default=8, help="pulls per measurement (one more is warm-up)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--records", default=str(RECORDS_DIR), help="folder of network.jsonl ('' writes none)")
    args = ap.parse_args(argv)
    if args.machines < 2:
        ap.error("--machines must be at least 2 (a pull needs a peer)")
    results = []
    for rep in range(args.repeats):
        results.append([])
        for bw in args.bandwidths.split(","):
            for size in (int(s) for s in args.sizes.split(",")):
                r = measure(bw, size, args.machines, args.rounds)
                print(f"repeat {rep}: {bw} {size / 1e6:.2f} MB per peer: pull {r['pull_s_median'] * 1e3:.1f} ms "
                      f"(nominal {r['nominal_s'] * 1e3:.1f}), efficiency {r['efficiency']:.2f}", flush=True)
                results[-1].append(r)
    if args.records:
        print(record(results, Path(args.records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
