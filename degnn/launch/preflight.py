"""Checks that run before anything is partitioned or started: each failure is one line that names
the config key the user set (or the file) and the fix.

`check_config(cfg)`: keys the schema does not have, the numbers (train.*, cluster counts,
bandwidth, timeouts), the model's sizes (hidden, heads, dropout, layers, fan-outs), the netns subnet.
`check_resume_dir(cfg, trainers)`: `resume=` (directory, checkpoint, matching config).
`check_run_dir(path, key)`: the run directory can be created and written (before Hydra does).
"""
from __future__ import annotations

import errno
import ipaddress
import math
import os

from .plan import LaunchError


def _int_at_least(cfg, key: str, low: int, why: str = "", prefix: str = "") -> None:
    value = _value(cfg, key)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise LaunchError(f"{prefix}{key}={value}: must be an integer >= {low}{why}")


def _positive(cfg, key: str, allow_zero: bool = False) -> None:
    value = _value(cfg, key)
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (
        value >= 0 if allow_zero else value > 0)
    if not ok:
        raise LaunchError(f"{key}={value}: must be a finite number {'>= 0' if allow_zero else '> 0'}")


def _value(cfg, key: str):
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def check_config(cfg) -> None:
    """The keys and numbers of a launch, before partitioning (one LaunchError naming the key)."""
    from degnn.config import unknown_keys

    extra = unknown_keys(cfg)
    if extra:
        key, known = extra[0]
        where = key.rsplit(".", 1)[0] if "." in key else "the top level"
        raise LaunchError(f"+{key}: the config has no such key; remove it or fix its spelling "
                          f"({where} has {', '.join(known)})")
    from degnn.pipelines import typed_config

    typed_config(cfg)  # the pipeline's own keys, by its class's schema (ValueError naming the key)
    _int_at_least(cfg, "train.epochs", 1, " (the number of epochs to train)")
    _int_at_least(cfg, "train.batch_size", 1)
    _int_at_least(cfg, "train.eval_batch_size", 1)
    _int_at_least(cfg, "train.eval_every", 1)
    _int_at_least(cfg, "train.batches_per_epoch", 0, " (0 = one pass over the training data)")
    _int_at_least(cfg, "train.checkpoint_every", 1)
    from degnn.runtime.device import DeviceError, device_of

    try:
        device_of(cfg.train.device)
    except DeviceError as e:
        raise LaunchError(str(e)) from None
    from degnn.models.backend import choose_backend

    try:
        choose_backend(cfg.model.backend, cfg.train.device)  # a known backend that can run there
    except ValueError as e:
        raise LaunchError(str(e)) from None
    _int_at_least(cfg, "train.patience", 0, " (0 = no early stop)")
    _positive(cfg, "train.min_delta", allow_zero=True)
    _positive(cfg, "train.lr")
    _positive(cfg, "train.weight_decay", allow_zero=True)
    check_model_sizes(cfg.model)
    check_evaluation(cfg)
    cl = cfg.cluster
    if cl.get("fault_timeout_s") is not None:
        raise LaunchError("cluster.fault_timeout_s was renamed: it is the grace period between "
                          "SIGTERM and SIGKILL, cluster.stop_grace_s; hangs are "
                          "cluster.hang_timeout_s")
    _int_at_least(cfg, "cluster.machines", 1)
    if cl.kind == "netns" and cl.machines > 99:
        raise LaunchError(f"cluster.machines={cl.machines}: cluster=netns supports 1..99 machines")
    _int_at_least(cfg, "cluster.trainers_per_machine", 1)
    _int_at_least(cfg, "cluster.servers_per_machine", 1)
    if cl.get("server_edges", "inner") not in ("inner", "all"):
        raise LaunchError(f"cluster.server_edges={cl.server_edges}: must be inner (the in-edges of a "
                          f"part's own nodes, what degnn samples) or all (the whole part)")
    if not 1 <= cl.port <= 65535 - cl.servers_per_machine:
        raise LaunchError(f"cluster.port={cl.port}: must be a TCP port with room for "
                          f"cluster.servers_per_machine={cl.servers_per_machine} ports after it")
    _positive(cfg, "cluster.stop_grace_s", allow_zero=True)
    _positive(cfg, "cluster.hang_timeout_s", allow_zero=True)
    if cl.bandwidth is not None:
        if cl.kind != "netns":
            raise LaunchError(f"cluster.bandwidth={cl.bandwidth}: only cluster=netns machines have "
                              f"links to cap; remove it for cluster={cl.kind}")
        from .netns import parse_rate

        if parse_rate(str(cl.bandwidth)) <= 0:
            raise LaunchError(f"cluster.bandwidth={cl.bandwidth}: must be a positive rate")
    from .limits import check_limits

    check_limits(cl)
    if cl.get("ifname") and cl.kind not in ("ssh", "slurm"):
        where = ("every netns machine's interface is eth0" if cl.kind == "netns"
                 else "a local run stays on loopback")
        raise LaunchError(f"cluster.ifname={cl.ifname} is for cluster=ssh and cluster=slurm "
                          f"({where}); remove it "
                          f"for cluster={cl.kind}")
    if cl.kind == "netns":
        check_subnet(str(cl.subnet))


def check_model_sizes(model) -> None:
    """The model's widths, dropout, layers and fan-outs: a zero or negative width dies in DGL's or
    torch's C++ code once the cluster is up (hidden=0), or in a traceback (heads=0)."""
    _int_at_least(model, "hidden", 1, " (the width of the hidden layers)", prefix="model.")
    _int_at_least(model, "heads", 1, " (the attention heads of model=gat)", prefix="model.")
    if model.name == "gat" and model.layers > 1 and model.hidden % model.heads:
        fit = max(model.heads, model.hidden - model.hidden % model.heads)
        raise LaunchError(f"model.hidden={model.hidden}: model=gat splits it over model.heads="
                          f"{model.heads} heads, so it must be a multiple of them, e.g. "
                          f"model.hidden={fit}")
    dropout = model.dropout
    if not (isinstance(dropout, (int, float)) and not isinstance(dropout, bool) and 0 <= dropout < 1):
        raise LaunchError(f"model.dropout={dropout}: must be in [0, 1) (the share of activations "
                          f"dropped in training)")
    check_fanouts(model)


def bad_fanouts(fanouts) -> list:
    """The fan-outs DGL's sampler cannot take: each must be an integer >= 1, or -1 (every neighbour)."""
    return [f for f in fanouts if not isinstance(f, int) or isinstance(f, bool) or not (f >= 1 or f == -1)]


def check_fanouts(model) -> None:
    """model.layers >= 1 and each fan-out >= 1 or -1 (every neighbour): DGL's sampler aborts in
    C++ (std::bad_alloc) on -2, and 0 trains on no neighbours at all. (One fan-out per layer is
    degnn.models.check_model_config's, whose suggested fix needs layers >= 1.)"""
    layers = model.layers
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise LaunchError(f"model.layers={layers}: must be an integer >= 1 (the number of GNN layers)")
    fanouts = list(model.fanouts)
    bad = bad_fanouts(fanouts)
    if bad:
        raise LaunchError(f"model.fanouts=[{','.join(map(str, fanouts))}]: each fan-out must be an "
                          f"integer >= 1 (or -1: every neighbour), got {bad[0]}")


def check_evaluation(cfg) -> None:
    """train.eval_fanouts: null, or one fan-out per layer (>= 1 or -1) for a node task; and
    train.eval_hidden_dtype one the evaluators know."""
    from degnn.tasks.evaluation import HIDDEN_DTYPES

    if str(cfg.train.eval_hidden_dtype) not in HIDDEN_DTYPES:
        raise LaunchError(f"train.eval_hidden_dtype={cfg.train.eval_hidden_dtype}: choose "
                          f"{' or '.join(HIDDEN_DTYPES)}")
    fanouts = cfg.train.get("eval_fanouts")
    _int_at_least(cfg, "train.eval_max_nodes", 0, " (0 = every validation and test node)")
    if fanouts is None:
        if cfg.train.get("eval_max_nodes", 0):
            raise LaunchError(f"train.eval_max_nodes={cfg.train.eval_max_nodes}: only a sampled evaluation "
                              f"(train.eval_fanouts) takes a subset; the full one computes every node anyway")
        return
    fanouts = list(fanouts)
    if bad_fanouts(fanouts) or len(fanouts) != cfg.model.layers:
        raise LaunchError(f"train.eval_fanouts=[{','.join(map(str, fanouts))}]: give one fan-out per layer "
                          f"(model.layers={cfg.model.layers}), each >= 1 or -1, or null for the full-neighbour "
                          f"evaluation of every node")
    if cfg.pipeline.name == "tma":
        raise LaunchError("train.eval_fanouts: pipeline=tma evaluates its averaged model over every node "
                          "(pipeline.evaluator_*); remove it")
    if cfg.dataset.get("task", "node") != "node":
        raise LaunchError(f"train.eval_fanouts: a sampled evaluation scores node tasks only; remove it for "
                          f"dataset {cfg.dataset.name} (task {cfg.dataset.task})")


def check_subnet(subnet: str) -> None:
    """cluster.subnet: the first three numbers of a /24 (`10.77.0`), for the netns bridge."""
    try:
        ok = len(subnet.split(".")) == 3 and ipaddress.ip_network(f"{subnet}.0/24").version == 4
    except ValueError:
        ok = False
    if not ok:
        raise LaunchError(f"cluster.subnet={subnet}: must be the first three numbers of a private "
                          f"/24 for the netns machines, e.g. cluster.subnet=10.77.0")


def check_run_dir(path: str, key: str = "hydra.run.dir") -> None:
    """The run directory (or the folder it will be made in) can be created and written: Hydra
    itself would end in a traceback on /proc, an existing file or a read-only mount."""
    if "${" in path:  # an interpolation only Hydra resolves
        return
    full = os.path.abspath(os.path.expanduser(path))
    probe = None
    try:
        if os.path.exists(full) and not os.path.isdir(full):
            raise LaunchError(f"{key}={path}: is an existing file, not a directory; pick another "
                              f"{key}")
        os.makedirs(full, exist_ok=True)
        probe = os.path.join(full, f".degnn-write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok\n")
    except OSError as e:
        why = {errno.EROFS: "read-only file system", errno.ENOSPC: "no space left on the device",
               errno.EACCES: "permission denied", errno.EPERM: "not permitted"}.get(e.errno, e.strerror)
        raise LaunchError(f"{key}={path}: cannot create or write the run directory ({why}); pick a "
                          f"writable directory, e.g. {key}=runs/<name>") from None
    finally:
        if probe is not None:
            try:
                os.unlink(probe)
            except OSError:
                pass


def check_resume_dir(cfg, trainers: int) -> None:
    """`resume=`: the directory, a checkpoint that loads (weights only), a matching config."""
    if not cfg.get("resume"):
        return
    from degnn.runtime.checkpoint import CheckpointError, check_resume

    try:
        check_resume(cfg, trainers)
    except CheckpointError as e:
        raise LaunchError(str(e)) from None


_TYPE_WORDS = {"Integer": "an int", "Float": "a float", "Boolean": "a bool (true or false)",
               "String": "a string"}


def config_error_line(e: BaseException) -> str:
    """One line for an error Hydra or OmegaConf raised while composing the config from the command
    line (a key the schema lacks, a value of the wrong type, a config group option that does not
    exist, an override that does not parse): the key, what is wrong and the fix."""
    import re

    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    first = _first_line(e)
    if isinstance(e, OverrideParseException):
        return (f"{e.override}: cannot parse this override ({e.message.splitlines()[0]}); write "
                f"KEY=VALUE (quote lists and strings with spaces for the shell)")
    if isinstance(e, MissingConfigException) and e.missing_cfg_file and e.options is not None:
        group, _, name = str(e.missing_cfg_file).rpartition("/")
        return (f"{group}={name}: there is no such {group} config (the choices: "
                f"{', '.join(e.options)})")
    cause = e.__cause__
    # "Error merging override KEY=VALUE": the override as written
    m = re.match(r"Error merging override (.*)$", first)
    override = m.group(1) if m else None
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and getattr(cause, "full_key", None):
        key = str(cause.full_key)
        where, _, _ = key.rpartition(".")
        known = _keys_of(getattr(cause, "parent_node", None))
        if where:
            has = f"{where} has {', '.join(known)}" if known else f"see {where} in docs/config.md"
        else:
            has = f"the top level has {', '.join(known)}" if known else "see docs/config.md"
        return f"{key}: the config has no such key; fix its spelling ({has})"
    if isinstance(cause, ValidationError) and getattr(cause, "full_key", None):
        key = str(cause.full_key)
        msg = _first_line(cause)
        override = override or key
        t = re.search(r"could not be converted to (\w+)", msg)
        if t:
            what = _TYPE_WORDS.get(t.group(1), t.group(1))
            bad = re.match(r"Value '(.*)' of type", msg)
            top = override.split("=", 1)[0].lstrip("+~")
            if key == top:
                return f"{override}: not {what}{_example(cause, key)}"
            return f"{override}: {key}={bad.group(1) if bad else '?'} is not {what}"
        t = re.search(r"is not a valid (\w+)", msg)
        if t:
            what = {"bool": "a bool (true or false)", "int": "an int", "float": "a float"}.get(t.group(1), t.group(1))
            return f"{override}: not {what}{_example(cause, key)}"
        if "is not Optional" in msg:
            return f"{override}: {key} cannot be null; give it a value (docs/config.md)"
        return f"{override}: {msg}"
    if cause is not None and override:
        return f"{override}: {_first_line(cause)}"
    # Hydra's own words, its lines joined (e.g. "+train=3": the second line names the fix)
    text = " ".join(l.strip() for l in str(e).strip().splitlines() if l.strip()) or type(e).__name__
    return text + (f" ({_first_line(cause)})" if cause is not None else "")


def _example(cause, key: str) -> str:
    """` (e.g. KEY=<its value in the config>)`, or nothing where that value is not at hand."""
    try:
        value = cause.parent_node._get_node(cause.key)._value()
    except Exception:  # noqa: BLE001 - no parent node (a list item): no example
        return ""
    if value is None or isinstance(value, (dict, list)):
        return ""
    return f" (e.g. {key}={str(value).lower() if isinstance(value, bool) else value})"


def _keys_of(node) -> list:
    try:
        return [str(k) for k in node.keys() if k != "hydra" and not str(k).startswith("_")]
    except Exception:  # noqa: BLE001 - a node without keys (a list): no list to give
        return []


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0].strip() if text else type(e).__name__


# what a run leaves that a fresh run would mix with its own (curve.jsonl appended to, the best
# model and checkpoint replaced, the summary of one describing the other)
RESULT_FILES = ("summary.json", "curve.jsonl", "checkpoint.pt", "best_model.pt")
# held (fcntl.flock) by the launcher while a run uses its directory
LOCK_FILE = ".degnn.lock"


def check_run_dir_unused(path: str, key: str = "hydra.run.dir", resume=None) -> None:
    """A run directory that holds another run's results is refused, unless this run resumes that
    one in place (`resume=` the same directory)."""
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(full):
        return
    if resume and os.path.abspath(os.path.expanduser(str(resume))) == full:
        return
    found = [f for f in RESULT_FILES if os.path.exists(os.path.join(full, f))]
    if found:
        raise LaunchError(f"{key}={path}: holds another run's results ({found[0]}); pick a new "
                          f"{key} (or remove that run's directory), or continue that run with "
                          f"resume={path}")


def lock_run_dir(path: str, key: str = "hydra.run.dir") -> int:
    """Take the run directory for this launcher (an exclusive flock on LOCK_FILE in it, held as long
    as the returned descriptor is open: until this launcher ends); LaunchError when another
    launcher holds it."""
    import fcntl

    full = os.path.abspath(os.path.expanduser(path))
    lock = os.path.join(full, LOCK_FILE)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)  # the umask decides, like every file here
    except OSError as e:
        raise LaunchError(f"{key}={path}: cannot create {LOCK_FILE} there ({e.strerror}); pick a "
                          f"writable {key}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        try:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        finally:
            os.close(fd)
        raise LaunchError(f"{key}={path}: another launcher (pid {holder}) is running in this "
                          f"directory now; wait until it ends, or pick another {key}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
