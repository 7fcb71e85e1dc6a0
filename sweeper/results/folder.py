"""The results folder as the tool owns it: which names are its own, who may write it, what
`--fresh` may delete, and the checks made before anything is created in it.

A results folder is trusted like code: trials re-read its `sweep.yaml` (a command line among
it) and the SLURM launcher unpickles its job results. So it is private to its owner (folders
0700, files 0600), and the tool refuses to act on one that others can write, that another user
owns, or that it did not make, before it creates, changes or deletes anything there.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from sweeper.errors import SweepError
from sweeper.files import check_owned, check_private_file
from sweeper.process import alive
from sweeper.results.study_guard import check_storage, check_study_file, default_storage

if TYPE_CHECKING:
    from sweeper.spec.sweep import Sweep

TRIAL_FILE = re.compile(r"^trial-(\d{5,})\.parquet$")  # what ResultsStore.write_row names a row
INFLIGHT_FILE = re.compile(r"^trial-(\d{5,})\.json$")
JOB_DIR = re.compile(r"^trial-\d{5,}-a\d+$")
TEMP_FILE = re.compile(r"^\..+\.(\d+)\.tmp$")  # an atomic write's temp file (its writer's pid), left by a kill
# top-level names the tool creates; the study's SQLite file brings its journal files along
OWN_FILES = {
    "sweep.yaml",
    ".sweep.yaml.tmp",
    "hf_config.json",  # the copy of a config.json model (sweeper.results.frozen), which sweep.yaml names
    "profile.yaml",  # the copy of the measured profile the sweep priced from (sweeper.results.frozen), likewise
    "run.lock",
    "optuna.db",
    "optuna.db-journal",
    "optuna.db-wal",
    "optuna.db-shm",
}
OWN_DIRS = {
    "trials": (TRIAL_FILE, TEMP_FILE),
    "inflight": (INFLIGHT_FILE, TEMP_FILE),
    "jobs": (JOB_DIR,),
    ".tmp": (TEMP_FILE,),
}  # .tmp/: a result being written, renamed into trials/ when complete
# what `sweep report` writes beside the results (sweeper.report)
REPORT_FILE = re.compile(
    r"^(report\.html|(heatmap_.+|mfu_vs_mbs|memory_pred_vs_measured|mfu_pred_vs_measured|progress"
    r"|status|step_breakdown|nodes_cost)\.png)$"
)
CORRUPT_STUDY = re.compile(r"^optuna\.db\.corrupt-\d+$")  # set aside by --rebuild-study
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600


def trial_number_of(name: str) -> int | None:
    """The trial number of one of the tool's row files, None for any other name."""
    m = TRIAL_FILE.match(name)
    return int(m.group(1)) if m else None


def foreign_entries(root: Path, *, top_only: bool = False) -> list[Path]:
    """Everything under `root` that the tool did not create (by name); `top_only`: in root itself only."""
    out = []
    for p in sorted(root.iterdir()):
        if p.name in OWN_DIRS and p.is_dir() and not p.is_symlink():
            if top_only:
                continue
            allowed = OWN_DIRS[p.name]
            out += [q for q in sorted(p.iterdir()) if not any(rx.match(q.name) for rx in allowed)]
        elif not (
            (p.name in OWN_FILES or CORRUPT_STUDY.match(p.name) or REPORT_FILE.match(p.name))
            and p.is_file()
            and not p.is_symlink()
        ):
            out.append(p)
    return out


def discard_own(root: Path, *, keep: str = "run.lock") -> int:
    """`--fresh`: delete what the tool created under `root`, after checking nothing else is
    there (then nothing is deleted at all). Returns the number of entries removed."""
    foreign = foreign_entries(root)
    if foreign:
        names = ", ".join(str(p.relative_to(root)) for p in foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise SweepError(
            f"--fresh: {root} holds {len(foreign)} file(s) the sweep did not create ({names}); nothing deleted. "
            "Move them away, or point results_dir elsewhere"
        )
    me = os.geteuid()
    others = [p for p in root.rglob("*") if p.lstat().st_uid != me]
    if others:  # the trust check saw the folder and its own parts; this is every file it would delete
        raise SweepError(f"--fresh: {others[0]} (and {len(others) - 1} more) belongs to another user; nothing deleted")
    removed = 0
    for p in sorted(root.iterdir()):
        if p.name == keep:
            continue
        shutil.rmtree(p) if p.is_dir() else p.unlink()
        removed += 1
    return removed


def preflight(sweep: Sweep, *, repair: bool = False) -> str:
    """Before anything is created, changed or deleted: the trust check of the results folder
    (`sweeper.results.folder.check_trusted_folder`), then the storage URL is one, over an existing folder
    and a readable database. `repair` (`--fresh`, `--rebuild-study`) lets an unreadable study
    through, as those two set it aside. Returns the storage."""
    root = sweep.results_path
    check_trusted_folder(root, sweep.name)
    if sweep.search.storage:
        check_storage(sweep.search.storage, damaged_ok=repair)
        return sweep.search.storage
    db = root / "optuna.db"  # the default: made with the folder; refused only when it is not a database
    if not repair:
        check_study_file(db)
    return default_storage(root)


# what a results folder's own files are checked for before anything is read or written in it;
# SQLite writes its journals beside the study, so a planted link there would be written through
CHECKED = (
    *OWN_DIRS,
    "sweep.yaml",
    "hf_config.json",
    "profile.yaml",
    "run.lock",
    "optuna.db",
    "optuna.db-journal",
    "optuna.db-wal",
    "optuna.db-shm",
)


def check_trusted_folder(root: Path, name: str) -> None:
    """The trust check, before anything under `root` is created, changed or deleted (`--fresh`,
    `--rebuild-study` included): it can be made, or it is a results folder `sweep` made for the
    sweep `name`, of yours, writable by you alone, with no link among its own files or job folders."""
    check_creatable(root)
    if not (root.exists() or root.is_symlink()):
        return
    check_private(root)
    check_made_by_sweep(root, name)
    jobs = root / "jobs"
    for p in sorted(jobs.iterdir()) if jobs.is_dir() else []:
        check_not_link(p)
        # what a launch writes there (result.json, log.txt, ranks/, a node's folder): never through a link
        for q in sorted(p.iterdir()) if p.is_dir() else []:
            check_not_link(q)


def check_made_by_sweep(root: Path, name: str) -> None:
    """Refuse an existing folder that `sweep` did not make for this sweep, changing nothing in it.

    Made by sweep: empty (nothing to take over); or holding a `sweep.yaml` that names this sweep
    beside `trials/` (a run makes trials/ first and records the sweep file after); or, with no
    sweep.yaml (a run stopped before recording it), holding only names of the tool's own. A
    project folder that happens to hold a `trials/`, or an unrelated `sweep.yaml`, is neither."""
    entries = sorted(p.name for p in root.iterdir())
    if not entries:
        return
    recorded = root / "sweep.yaml"
    if recorded.is_file() and not recorded.is_symlink():
        other, why = recorded_name(recorded)
        if other is None:
            raise SweepError(
                f"{recorded} is not a sweep file ({why}), so {root} is not the results folder of the sweep "
                f"{name!r}; nothing was changed in it. Give the sweep another name or results_dir"
            )
        if other != name:
            raise SweepError(
                f"{root} exists and holds the sweep file of {other!r}, not of the sweep {name!r}; nothing was "
                "changed in it. Give the sweep another name or results_dir"
            )
        if (root / "trials").is_dir():
            return
        foreign = ["sweep.yaml but no trials/"]
    else:
        foreign = [p.name for p in foreign_entries(root, top_only=True)]
    if foreign:
        shown = ", ".join(foreign[:3]) + (" ..." if len(foreign) > 3 else "")
        raise SweepError(
            f"{root} exists and was not made by sweep (it holds {shown}); nothing was changed in it. "
            "Give the sweep another name or results_dir"
        )


def recorded_name(path: Path) -> tuple[str | None, str]:
    """The `name` of a results folder's recorded sweep file, or None and why it is not a sweep file.
    Read as YAML only (the sweep loader's own reader: no aliases, no deep nesting), not checked
    against today's schema: a folder of an older version is still the sweep's."""
    from sweeper.files import FileRefused, parse_yaml, read_limited
    from sweeper.spec.loader import MAX_SPEC_BYTES

    try:
        data = parse_yaml(read_limited(path, max_bytes=MAX_SPEC_BYTES), path)
    except FileRefused as e:
        return None, str(e).removeprefix(f"{path}: ")
    value = data.get("name") if isinstance(data, dict) else None
    return (value, "") if isinstance(value, str) else (None, "it names no sweep")


def check_readable_folder(root: Path) -> None:
    """What `best`, `status` and `report` check before reading a results folder: the same links
    `sweep run` refuses (the folder itself, trials/, inflight/, sweep.yaml), refused alike: read
    through a link, another folder's rows would be shown (and a report written) as this sweep's."""
    for p in (root, root / "trials", root / "inflight", root / "sweep.yaml"):
        check_not_link(p)


def check_not_link(path: Path) -> None:
    """Nothing under a results folder is followed through a symbolic link: refuse one where a
    file or folder of the sweep's own belongs (a link planted there would be written through)."""
    if path.is_symlink():
        raise SweepError(
            f"{path} is a symbolic link (to {os.readlink(path)}); a results folder must hold the sweep's own "
            "files. Remove the link and run again"
        )


def check_private(root: Path) -> None:
    """Refuse a results folder (or its parts: its own files and folders, and every row and in-flight
    record in them, which `sweep run` learns from and starts trials by) that another user owns or that
    others can write: whoever can write it can run code as the next `sweep run`, or plant results."""
    for p in [root, *(root / n for n in CHECKED)]:
        try:
            st = p.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            check_not_link(p)
        _check_owned(p, st, root)
    for folder in ("trials", "inflight"):
        d = root / folder
        for p in sorted(d.iterdir()) if d.is_dir() and not d.is_symlink() else []:
            st = p.lstat()
            if not stat.S_ISLNK(st.st_mode):  # a link is skipped by name, never followed
                _check_owned(p, st, root)


def _check_owned(p: Path, st: os.stat_result, root: Path) -> None:
    trusted = "a results folder is trusted like code"
    check_owned(p, fix=trusted, mode_fix=f"{trusted}. Check its contents, then `chmod -R go-w {root}`", st=st)


def remove_stale_temps(root: Path) -> int:
    """Remove the temp files of atomic writes whose writer is dead (a `sweep run` killed while it wrote):
    its process id is in the name, and a live writer's file is left alone. Returns how many went."""
    removed = 0
    for d in (root, *(root / n for n in OWN_DIRS if n != "jobs")):
        for p in sorted(d.iterdir()) if d.is_dir() and not d.is_symlink() else []:
            m = TEMP_FILE.match(p.name)
            if m is not None and not alive(int(m.group(1))) and (p.is_symlink() or p.is_file()):
                p.unlink(missing_ok=True)
                removed += 1
    return removed


def make_private(root: Path) -> None:
    """Create the results folder (and missing parents) 0700; one-line error when that fails."""
    try:
        root.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        os.chmod(root, stat.S_IMODE(root.stat().st_mode) & ~0o077)
    except OSError as e:
        raise SweepError(f"results_dir: cannot create {root}: {e.strerror or e}") from None


def check_creatable(root: Path) -> None:
    """Before anything is created: the results folder exists as a folder we may write, or can be made."""
    p = root
    while not p.exists():
        if p.is_symlink() or p.parent == p:
            break
        p = p.parent
    if not p.is_dir():
        raise SweepError(f"results_dir: {p} is not a folder, so {root} cannot be created")
    if not os.access(p, os.W_OK | os.X_OK) or _read_only_mount(p):
        raise SweepError(f"results_dir: {p} is not writable, so {root} cannot be created or updated")


def _read_only_mount(p: Path) -> bool:
    """root ignores file modes, not a read-only file system: ask the file system."""
    try:
        return bool(os.statvfs(p).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_trusted_file(path: Path) -> None:
    """Before unpickling a file from the results folder (a SLURM job's result): it is a plain file
    of ours that nobody else could have written. Anything else is refused, not read."""
    check_private_file(path, refusing="refusing to unpickle it (a results folder is trusted like code)")
