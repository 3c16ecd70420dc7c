"""The run directory a launcher uses: private, locked, and gone again where a run is refused.

The launcher runs with umask 077 from its start (every file it and the processes it starts write
is the user's alone; cluster.share_run_dir=true gives the user's umask back), while the dataset and
partition caches are written with the user's own umask. It locks the run directory (preflight's
lock_run_dir) before anything is written there and refuses one that holds another run's results.
What it made itself (the topmost folder it created for the run directory, a lock file) is noted,
so that a run refused before anything started leaves nothing behind (`remove_made`).
"""
from __future__ import annotations

import os
import shutil

from .plan import LaunchError
from .preflight import LOCK_FILE, check_run_dir_unused, lock_run_dir

# the run directory this launcher made (the topmost folder it created), with whether it may go
# whole: a run refused before anything started leaves nothing behind (a sweep's folder only when
# it is still empty: an earlier job of the sweep may have written there)
_MADE: list = []


# the umask the launcher was started with; it runs with 077 (the run directory private) unless
# cluster.share_run_dir (None: main() was not entered through cli())
_USER_UMASK = None


def with_user_umask(fn, *args):
    """fn(*args) under the user's own umask: the dataset and partition caches are shared, the
    run directory is not."""
    if _USER_UMASK is None:
        return fn(*args)
    private = os.umask(_USER_UMASK)
    try:
        return fn(*args)
    finally:
        os.umask(private)


def set_modes(run_dir: str, share: bool, sweep_dir) -> None:
    """The umask of this job, and what was made so far (the run directory, Hydra's files in it;
    shared: the folders made for it too) as that umask makes it. cluster.share_run_dir=true: the
    user's umask; else 077 (again: a sweep's earlier job may have shared its own)."""
    if _USER_UMASK is None:
        return
    mask = _USER_UMASK if share else 0o077
    if os.umask(mask) == mask:
        return  # what was made was made under this umask
    dirs, files = 0o777 & ~mask, 0o666 & ~mask
    paths = []
    for top, leaf, _ in _MADE if share else ():
        if not os.path.isdir(top):
            continue
        path = leaf
        while path.startswith(top):
            paths.append((path, dirs))
            path = os.path.dirname(path)
    if share and sweep_dir and os.path.isdir(sweep_dir):
        paths += [(sweep_dir, dirs), (os.path.join(sweep_dir, "multirun.yaml"), files)]
    for root, subdirs, names in os.walk(run_dir):
        paths.append((root, dirs))
        paths += [(os.path.join(root, n), files) for n in names]
    for path, mode in paths:
        try:
            os.chmod(path, mode)
        except OSError:
            pass


def remove_made() -> None:
    for top, leaf, whole in _MADE:
        if whole:
            if os.path.isdir(top):
                shutil.rmtree(top, ignore_errors=True)
            elif os.path.lexists(top):  # a lock file this launcher made
                os.unlink(top)
            continue
        if os.path.isdir(leaf) and os.listdir(leaf) == ["multirun.yaml"]:  # Hydra's, no job yet
            os.unlink(os.path.join(leaf, "multirun.yaml"))
        path = leaf
        while True:  # the empty folders, from the leaf up to the topmost made
            try:
                os.rmdir(path)
            except OSError:
                break
            if path == top:
                break
            path = os.path.dirname(path)
    _MADE.clear()


# run directory -> the descriptor of its lock (preflight.lock_run_dir), held while its run goes on
_LOCKS: dict = {}


def take(run_dir: str, key: str, resume) -> None:
    """Lock the run directory for this launcher, then refuse one that holds another run's results
    (LaunchError)."""
    full = os.path.abspath(run_dir)
    if full in _LOCKS:
        return
    lock = os.path.join(full, LOCK_FILE)
    created = not os.path.exists(lock)
    fd = lock_run_dir(run_dir, key)
    try:
        check_run_dir_unused(run_dir, key, resume)
    except LaunchError:
        os.close(fd)
        raise
    _LOCKS[full] = fd
    if created:
        note_made(lock, lock, True)  # a run refused before it starts leaves none behind


def holds(run_dir: str) -> bool:
    """Whether this launcher has taken (locked) `run_dir`."""
    return os.path.abspath(run_dir) in _LOCKS


def release_all() -> None:
    for fd in _LOCKS.values():
        os.close(fd)
    _LOCKS.clear()


def first_missing(path: str):
    """The topmost folder of `path` that does not exist yet (None: it exists, or only Hydra
    resolves it)."""
    if "${" in path:
        return None
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(full):
        return None
    while not os.path.exists(os.path.dirname(full)):
        full = os.path.dirname(full)
    return full




def keep_private() -> None:
    """From now on this process writes with umask 077; the user's own is kept for the caches and
    for cluster.share_run_dir."""
    global _USER_UMASK
    _USER_UMASK = os.umask(0o077)


def note_made(top: str, leaf: str, whole: bool) -> None:
    """`top`, the topmost folder this launcher created for `leaf`, goes again where the run is
    refused: whole, or (a folder shared by runs) only as far as it is empty."""
    _MADE.append((top, leaf, whole))


def forget_made() -> None:
    """The run has started: its directory is the run's now, whatever happens."""
    _MADE.clear()
