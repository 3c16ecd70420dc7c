"""`python -m degnn.infer RUN_DIR [--out DIR] [KEY=VALUE ...]` (or `degnn-infer`): every node's embedding (and, for
node classification, its logits and predicted class) from a finished run's best model.

Starts the run's cluster again from its config.yaml, on its partitions, through the launcher
(degnn.launch.launch) with worker.py as every process's entry; each machine writes its own
nodes to DIR/part<i>.pt (default RUN_DIR/embeddings/), keyed by original node id; the logs of
the inference cluster are there too. KEY=VALUE changes cluster.* (e.g. another bandwidth, ssh
hosts), train.eval_batch_size, train.device, or dataset.root, partition.root and partition.path
(data that moved); the rest is the run's. Read the files back with degnn.infer.load_embeddings(DIR). Bad input: one line on stderr, exit status 2, nothing started.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from degnn.infer import PART_FILE, SUMMARY


def _fail(msg: str, code: int = 2) -> None:
    if code > 128:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(f"degnn.infer: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def parse(argv):
    ap = argparse.ArgumentParser(
        prog="degnn-infer" if Path(sys.argv[0]).name == "degnn-infer" else "python -m degnn.infer",
        description="Write every node's embedding (and prediction) of a finished run's best model, "
                    "computed on the run's cluster, each machine writing its own nodes.")
    ap.add_argument("run_dir", help="the run directory (hydra.run.dir) of a finished training run")
    ap.add_argument("--out", help="output folder (default RUN_DIR/embeddings)")
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                    help="cluster.*, train.eval_batch_size, train.device, dataset.root, partition.root, "
                         "partition.path")
    return ap.parse_args(argv)


def clear_outputs(out: Path) -> None:
    """An earlier inference's files in `out` (a run of more machines could leave extra parts)."""
    for f in [*out.glob(PART_FILE.format("*")), out / SUMMARY]:
        f.unlink(missing_ok=True)


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    run_dir = Path(args.run_dir).expanduser().absolute()
    out = Path(args.out).expanduser().absolute() if args.out else run_dir / "embeddings"
    from degnn.infer.run import InferError, check_overrides, load_best_model, run_config, run_partitions
    from degnn.launch.plan import LaunchError
    from degnn.launch.preflight import check_run_dir

    try:
        check_overrides(args.overrides)
        cfg = run_config(run_dir, args.overrides)
        load_best_model(run_dir)  # before anything starts: the file is there and readable
        part_config = run_partitions(cfg, run_dir)
        if not cfg.cluster.get("share_run_dir"):  # private, like the run's own directory
            os.umask(0o077)
        check_run_dir(str(out), "--out")
    except (InferError, LaunchError) as e:
        _fail(str(e))
    from degnn.launch.launcher import launch

    print(f"partitions: {part_config}", flush=True)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not cfg.cluster.dry_run:  # a dry run prints the plan and leaves the folder as it is
            clear_outputs(out)
    except OSError as e:
        _fail(f"--out {out}: cannot write the output folder ({e.strerror or e})")
    try:
        rc = launch(cfg, str(out), str(part_config), [f"infer.run={run_dir}", *args.overrides],
                    entry="degnn.infer.worker")
    except LaunchError as e:
        _fail(str(e))
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        _fail(f"interrupted by {signal.Signals(signum).name} before the processes started; nothing "
              f"was written", 128 + signum)
    if rc != 0 or cfg.cluster.dry_run:
        return rc
    info = json.loads((out / SUMMARY).read_text())
    what = f"{info['embedding']}, {info['dims']['embedding']} dims"
    if info["task"] == "node":
        what += "; logits and predicted classes"
    run_test = info.get("run_test")
    print(f"embeddings: {info['num_nodes']} nodes in {out} ({', '.join(info['files'])}: {what}); "
          f"test {info['metric']} {info['test']:.4f}"
          + (f" (the run reported {run_test:.4f})" if run_test is not None else ""), flush=True)
    return 0


def cli() -> None:
    """The command line (`python -m degnn.infer`, the `degnn-infer` console script)."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        _fail("interrupted while starting; nothing was started", 130)


if __name__ == "__main__":
    cli()
