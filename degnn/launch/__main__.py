"""`python -m degnn.launch <hydra overrides>` (or `degnn-launch`): start a cluster job (or a sweep of them with -m).

Each Hydra job: build or find the partitions (`degnn.partition_cache.ensure_partitions`), then run one
cluster in the job's own output directory (`cluster.dry_run=true`: print the plan, with the
partitions it would build, and build nothing). `-m` sweeps run one cluster after another, every
job even where one fails (sweep.py: the job returns its exit status, and a Hydra callback prints
the table of the jobs at the end); the processes themselves always run a single job
(`hydra.run.dir=<that directory>`), never a sweep.
`--cleanup` (anywhere on the command line) runs cleanup.py instead.

Test-only hook: DEGNN_ENTRY=<module> replaces the per-process entry `degnn.train`
(tests/fake_entry.py). Nothing else reads it.
"""
from __future__ import annotations

import os
import signal
import sys

from degnn.startup import pause_collector, resume_collector

pause_collector()  # until the imports below are done (degnn/startup.py)
try:  # torch and DGL take seconds to import: Ctrl-C meanwhile is one line, not a traceback
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf import DictConfig
    from omegaconf.errors import OmegaConfBaseException

    from degnn.config import CONF_DIR, register_configs
    from degnn.models import check_model_config
    from degnn.pipelines import check_task, check_trainers, pipeline_class
    from degnn.runtime.checkpoint import CONFIG_FILE
    from degnn.runtime.run_config import resume_conflict, resume_group_overrides, resumed_config

    from .plan import LaunchError
    from .supervisor import STOP_SIGNALS
    from . import rundir
    from .preflight import check_config, check_resume_dir, check_run_dir, config_error_line
except KeyboardInterrupt:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # leaving: Ctrl-C again changes nothing (rc stays 130)
    print("degnn.launch: error: interrupted while starting; nothing was started", file=sys.stderr,
          flush=True)
    sys.exit(130)
resume_collector()

register_configs()


class JobFailed(SystemExit):
    """`_fail`'s exit: the process's, or in a sweep the job's (main returns its code)."""

    def __init__(self, code: int, message: str):
        super().__init__(code)
        self.message = message


def _fail(msg: str, code: int = 2) -> None:
    # one line, no traceback: bad input must read like a message, not a crash
    if code > 128:  # an interrupt: the clean-up is done, a signal more while leaving changes nothing
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    rundir.remove_made()
    print(f"degnn.launch: error: {msg}", file=sys.stderr, flush=True)
    raise JobFailed(code, msg)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def config_dirs(hc) -> list:
    """The folders Hydra composes from (conf/ and those on hydra.searchpath)."""
    return [s.path for s in hc.runtime.config_sources if s.schema == "file" and s.path]


def _print_partition_report(part_config) -> None:
    import json
    from pathlib import Path

    from partitioners.stats import format_table

    stats = Path(part_config).parent / "stats.json"
    if stats.is_file():
        print(format_table(json.loads(stats.read_text())), flush=True)
    print(f"partitions: {part_config}", flush=True)


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> int:
    """One job. A single run leaves with its exit status; a sweep's job returns it, so that the
    sweep goes on to its next job (sweep.py), unless it was interrupted (128 + the signal)."""
    hc = HydraConfig.get()
    sweep = hc.mode == RunMode.MULTIRUN
    try:
        rc = _job(cfg)
    except JobFailed as e:
        if not sweep or e.code > 128:
            raise
        if rundir.holds(hc.runtime.output_dir):  # its own directory: its status goes there
            _write_refusal(cfg, hc.runtime.output_dir, e.message)
        return e.code
    except (HydraException, OmegaConfBaseException) as e:
        if not sweep:
            e._degnn_job = True  # the job's own error, not a bad command line: Hydra reports it
            raise
        line = config_error_line(e)
        print(f"degnn.launch: error: {line}", file=sys.stderr, flush=True)
        if rundir.holds(hc.runtime.output_dir):
            _write_refusal(cfg, hc.runtime.output_dir, line)
        return 2
    finally:
        rundir.release_all()  # a sweep's next job has a directory of its own
    if rc and (not sweep or rc > 128):
        sys.exit(rc)
    return rc


def _write_refusal(cfg, run_dir: str, message: str) -> None:
    """summary.json (status failed, the error) of a sweep's job refused before it started."""
    from .launcher import write_failure

    write_failure(run_dir, cfg, message)


def _job(cfg: DictConfig) -> int:
    from degnn.runtime.cluster import count_ip_config

    from .launcher import machines_of

    hc = HydraConfig.get()
    run_dir = hc.runtime.output_dir
    rundir.set_modes(run_dir, bool(cfg.cluster.get("share_run_dir")),
                   hc.sweep.dir if hc.mode.name == "MULTIRUN" else None)
    try:  # a sweep's job (or a run directory only Hydra names): taken here, once Hydra made it
        rundir.take(run_dir, "hydra.run.dir", cfg.get("resume"))
    except LaunchError as e:
        _fail(str(e))
    task = list(hc.overrides.task)
    if cfg.get("resume"):  # the run's own config, under the overrides given (run_config.py)
        why = resume_conflict(cfg, task)
        if why:
            _fail(why)
        try:
            cfg = resumed_config(cfg, task)
        except OmegaConfBaseException as e:
            _fail(f"resume={cfg.resume}: its {CONFIG_FILE} does not fit this degnn version "
                  f"({_one_line(e)}); resume with the version that wrote it, or start a new run")
    # config folders on Hydra's search path (a pipeline of one's own) reach every process too
    task += [o for o in hc.overrides.hydra if o.startswith("hydra.searchpath=")]
    try:
        # cheap checks first: no partitioning for a run that cannot start
        check_config(cfg)
        machines = machines_of(cfg.cluster)
        if cfg.cluster.kind in ("ssh", "slurm"):
            task += count_ip_config(cfg.cluster, task, len(machines))
        pipeline_cls = pipeline_class(cfg)  # check_config has typed its keys by the class's schema
        check_task(pipeline_cls, cfg, config_dirs(hc))
        check_trainers(pipeline_cls, cfg)
        check_model_config(cfg.model)
        # the pipeline's own checks; it may pick the partition (TMA's variants) for every process
        picked = pipeline_cls.prepare_launch(cfg, task)
        task += picked
        check_resume_dir(cfg, len(machines) * cfg.cluster.trainers_per_machine)
        if cfg.partition.path:  # made elsewhere: checked, then used as it is
            from partitioners import PartitionError, existing_partition

            wants = [o.split("=", 1)[1] for o in picked if o.startswith("partition=")]
            try:
                part_config = existing_partition(cfg.partition.path, len(machines), wants[0] if wants else None)
            except PartitionError as e:
                raise ValueError(str(e)) from None
    except (LaunchError, NotImplementedError, ValueError) as e:
        _fail(str(e))
    if cfg.partition.path:
        print(f"partitions: {part_config} (partition.path: used as it is)", flush=True)
        return _launch(cfg, run_dir, str(part_config), task)
    try:
        from degnn.partition_cache import ensure_partitions, planned_partitions
    except ImportError as e:
        _fail(f"degnn.partition_cache.ensure_partitions is not available ({_one_line(e)})")
    if cfg.cluster.dry_run:  # the plan, with the partitions a real run uses or builds: no dataset
        try:
            part_config, built = planned_partitions(cfg.dataset, cfg.partition)
        except Exception as e:  # noqa: BLE001 - the partitioner's own message (bad method, K)
            _fail(_one_line(e))
        if built:
            _print_partition_report(part_config)
        return _launch(cfg, run_dir, str(part_config), task)
    # Ctrl-C, SIGTERM or SIGHUP during the build: remembered here as well, because a library
    # that catches every exception (ogb, DGL) may swallow the KeyboardInterrupt and carry on;
    # only the first one raises, so the partitioner's own clean-up is not cut short
    interrupted = []

    def on_interrupt(signum, frame):
        interrupted.append(signum)
        if len(interrupted) == 1:
            raise KeyboardInterrupt

    old = {s: signal.signal(s, on_interrupt) for s in STOP_SIGNALS}
    try:
        part_config = rundir.with_user_umask(ensure_partitions, cfg.dataset, cfg.partition)
    except KeyboardInterrupt:
        interrupted.append(signal.SIGINT)
    except Exception as e:  # the partitioner's own message (dataset missing, bad method, ...)
        if not interrupted:
            _fail(_one_line(e))
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if interrupted:
        _fail("interrupted while preparing the dataset and partitions; nothing was started",
              128 + interrupted[0])
    # a partition built here leaves the whole graph's freed blocks in this process's heap, which
    # then waits out the whole run beside the machines: hand them back to the kernel
    from degnn.proc import trim_heap

    trim_heap()
    _print_partition_report(part_config)
    return _launch(cfg, run_dir, str(part_config), task)


def _launch(cfg, run_dir: str, part_config: str, task: list) -> int:
    """The cluster's exit status (0: every trainer finished; its summary.json says how)."""
    from .launcher import launch

    rundir.forget_made()  # from here on the run directory is the run's: its summary says what happened
    try:
        rc = launch(cfg, run_dir, part_config, task,
                    entry=os.environ.get("DEGNN_ENTRY") or cfg.cluster.entry)
    except LaunchError as e:
        _fail(str(e))
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        _fail(f"interrupted by {signal.Signals(signum).name} before the processes started; every "
              f"namespace of this run was removed, no summary.json written", 128 + signum)
    return rc


# Hydra's flags that print and run no job (nor create its directory)
NO_JOB_FLAGS = ("-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "--version")


def _run_dir_args(argv) -> list:
    """(key, value) of the directories Hydra will create: hydra.run.dir, or hydra.sweep.dir for
    -m; the defaults (conf/config.yaml) are under ./runs. None for a flag that runs no job."""
    if any(a in NO_JOB_FLAGS or a.startswith("--cfg=") for a in argv):
        return []
    multirun = any(a in ("-m", "--multirun") for a in argv)
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = [a.split("=", 1)[1] for a in argv if a.split("=", 1)[0].lstrip("+~") == key]
    return [(key, given[-1] if given else "runs")]


def _given(argv, key: str):
    """The last value the command line gives `key` (None: not given)."""
    values = [a.split("=", 1)[1] for a in argv if "=" in a and a.split("=", 1)[0].lstrip("+~") == key]
    return values[-1] if values else None


def _config_errors_in_one_line() -> None:
    """Hydra prints its own message of several lines (exit status 1) for a key the schema lacks, a
    value of the wrong type or an override that does not parse, before any job runs: print
    degnn's one line naming the key instead, exit status 2 (like every other refusal here)."""
    import hydra._internal.utils as hydra_utils

    report = hydra_utils.run_and_report
    if getattr(report, "_degnn", False):
        return

    def run_and_report(func):
        def composing():
            try:
                return func()
            except (HydraException, OmegaConfBaseException) as e:
                if getattr(e, "_degnn_job", False):
                    raise
                _fail(config_error_line(e))
        return report(composing)

    run_and_report._degnn = True
    hydra_utils.run_and_report = run_and_report


def cli() -> None:
    """The command line (`python -m degnn.launch`, the `degnn-launch` console script)."""
    try:
        if "--cleanup" in sys.argv[1:]:  # leftovers of launchers that are gone (cleanup.py)
            from .cleanup import main as cleanup_main
            sys.exit(cleanup_main([a for a in sys.argv[1:] if a != "--cleanup"]))
        # the run directory is private from its first folder on: every file the launcher and
        # the processes it starts write (cluster.share_run_dir=true gives the user's umask back)
        rundir.keep_private()
        try:
            for key, value in _run_dir_args(sys.argv[1:]):
                new = rundir.first_missing(value)
                check_run_dir(value, key)
                named = _given(sys.argv[1:], key) is not None
                if new:  # a folder of the user's naming goes whole; ./runs, shared by runs, when empty
                    rundir.note_made(new, os.path.abspath(os.path.expanduser(value)),
                                     key == "hydra.run.dir" and named)
                if key == "hydra.run.dir" and named and "${" not in value:
                    # before Hydra writes its files there: not over another run's
                    rundir.take(os.path.expanduser(value), key, _given(sys.argv[1:], "resume"))
        except LaunchError as e:
            _fail(str(e))
        resume = _given(sys.argv[1:], "resume")
        if resume and "," not in resume:  # resume=DIR: the run's own config groups (run_config.py)
            sys.argv += resume_group_overrides(resume, [a for a in sys.argv[1:] if "=" in a])
        # name the job (Hydra would call it "__main__": <run dir>/__main__.log)
        if not any(a.startswith("hydra.job.name=") for a in sys.argv[1:]):
            sys.argv.append("hydra.job.name=launch")
        _config_errors_in_one_line()
        main()
    except KeyboardInterrupt:  # before the launcher's own handlers (Hydra composing the config)
        _fail("interrupted while starting; nothing was started", 130)


if __name__ == "__main__":
    cli()
