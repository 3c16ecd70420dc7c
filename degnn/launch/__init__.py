"""The launcher: `python -m degnn.launch <hydra overrides>` (cluster=local | netns | ssh).

Public API:
  launch(cfg, run_dir, part_config, task_overrides, entry=...) -> exit status   (one cluster job)
  make_plan(cfg, run_dir, part_config, task_overrides, ...) -> Plan   (what would start, pure)
  build_plan(...), Plan, Proc                                          (plan.py)
  NetnsCluster, cleanup_stale                                          (netns.py)
  Supervisor                                                           (supervisor.py)
  LaunchError: a one-line error before or while starting.
"""
from .plan import DEFAULT_ENTRY, LaunchError, Plan, Proc, build_plan, read_part_config
from .launcher import launch, make_plan, finalize_summary, result_line
from .netns import NetnsCluster, cleanup_stale
from .supervisor import Supervisor

__all__ = ["DEFAULT_ENTRY", "LaunchError", "Plan", "Proc", "build_plan", "read_part_config",
           "launch", "make_plan", "finalize_summary", "result_line", "NetnsCluster",
           "cleanup_stale", "Supervisor"]
