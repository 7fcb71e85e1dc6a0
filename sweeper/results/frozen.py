"""A sweep's results folder as `sweep run` opens it: the sweep file frozen beside the results, and
the refusal of rows that another experiment measured.

A results folder is comparable only with itself: `sweep.yaml` keeps the sweep file as first run,
and a later run whose model, batch, cluster, space or trial settings differ is refused (with
--fresh advice) before anything runs; every row carries the sweep's identity
(`sweeper.results.identity`), and rows of another identity, or rows without one once the frozen file is
gone, are refused the same way.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

from sweeper.errors import SweepError
from sweeper.files import FileRefused, atomic_write_bytes, read_limited
from sweeper.results.folder import make_private
from sweeper.results.rows import ResultsStore
from sweeper.spec.hf_config import FROZEN_NAME
from sweeper.spec.loader import KEPT_PROFILE, MAX_SPEC_BYTES, parse_sweep
from sweeper.spec.sweep import Sweep

FROZEN_SPEC = "sweep.yaml"
FROZEN_MODEL = FROZEN_NAME  # the copy of a config.json model beside it


def open_results(sweep: Sweep, identity: str) -> tuple[ResultsStore, Path]:
    """The sweep's results store, made private and checked to hold this sweep's rows only, and the
    path of its frozen sweep file."""
    store = ResultsStore(sweep.results_path, identity=identity, space=sweep.space)
    frozen_existed = (store.root / FROZEN_SPEC).exists()
    make_private(store.root)
    store.ensure()
    store.identity = None  # first the rows without an identity, then the foreign ones
    unlabelled = [r for r in store.rows() if not r.get("sweep_id")]
    store.identity = identity
    if unlabelled and not frozen_existed:
        raise SweepError(
            f"{store.trials_dir} holds {len(unlabelled)} row(s) with no sweep identity and {FROZEN_SPEC} is gone, "
            "so nothing says which experiment they measured; move them away, or give this sweep a new name"
        )
    if frozen_existed:  # its own message first: the sweep file changed since (with --fresh advice)
        spec_path = freeze_spec(sweep, store)
    check_rows_identity(store)
    if not frozen_existed:  # written only once the rows are known to be this sweep's
        spec_path = freeze_spec(sweep, store)
    return store, spec_path


def freeze_spec(sweep: Sweep, store: ResultsStore) -> Path:
    """Keep the sweep file beside its results; refuse to continue a sweep whose file changed."""
    frozen = store.root / FROZEN_SPEC
    if sweep.source is None:
        raise SweepError("a sweep run needs a sweep file (got a sweep without a source path)")
    text = Path(sweep.source).read_bytes()
    if sweep.model_file is not None or sweep.cluster.profile is not None:
        text = _with_copies(text, sweep)
    if frozen.exists():
        # the profile is how the model prices, not what was measured (and may have moved since)
        old = parse_sweep(_read(frozen), source=str(frozen), profiles=False)
        if _identity(old) != _identity(sweep):
            raise SweepError(
                f"{sweep.source} changed since {frozen} was recorded (model, batch, cluster, space or "
                "trial settings differ); run with --fresh to start over, or give the sweep a new name"
            )
    try:
        if sweep.model_file is not None:  # first the copies the frozen file names
            atomic_write_bytes(store.root / FROZEN_MODEL, sweep.model_file.text)
        if sweep.cluster.profile is not None:
            profile = sweep.cluster.profile.profile.to_dict()
            atomic_write_bytes(store.root / KEPT_PROFILE, yaml.safe_dump(profile, sort_keys=False).encode())
        atomic_write_bytes(frozen, text)
    except OSError as e:
        raise SweepError(
            f"cannot write {frozen}: {e.strerror or e}; nothing was run. Free the space and run again"
        ) from None
    return frozen


def _with_copies(text: bytes, sweep: Sweep) -> bytes:
    """The sweep file as frozen when it read a file from beside it: a config.json model
    (`model.hf_config` names the copy kept as FROZEN_MODEL, so that trials, `sweep best` and a later
    run read it as it was run, and a change is noticed as a changed sweep file is), or a measured
    profile (`cluster.profile` names the copy kept as KEPT_PROFILE, so that the results open wherever
    the folder is and whatever happened to the file: the profile is not part of the identity)."""
    data = yaml.safe_load(text)  # the loader read it already: a mapping without aliases
    notes = []
    if sweep.model_file is not None:
        data["model"] = {"hf_config": FROZEN_MODEL}
        notes.append(f"its model.hf_config {_flat(sweep.model_file.path)} is copied beside it as {FROZEN_MODEL}")
    if sweep.cluster.profile is not None:
        data.setdefault("cluster", {})["profile"] = KEPT_PROFILE
        notes.append(f"its measured profile {_flat(sweep.cluster.profile.path)} is copied beside it as {KEPT_PROFILE}")
    return (f"# {_flat(sweep.source)} as run; {'; '.join(notes)}\n" + yaml.safe_dump(data, sort_keys=False)).encode()


def _flat(path: object) -> str:
    """A path on one line of a YAML comment (a newline in a file name would end the comment)."""
    return " ".join(str(path).split())


def _identity(s: Sweep) -> tuple:
    """What makes results comparable: everything but the search budget, launcher and paths."""
    return (
        s.name,
        s.model,
        s.seq_len,
        s.global_batch_size,
        s.cluster,
        s.node_counts,
        s.space,
        s.trial,
        s.memory,
        s.workload,
    )


def check_rows_identity(store: ResultsStore) -> None:
    """Refuse rows of another sweep (another identity than the store's)."""
    store.rows()
    if store.foreign:
        names = ", ".join(p.name for p in store.foreign[:3])
        raise SweepError(
            f"{store.trials_dir} holds {len(store.foreign)} row file(s) of another sweep ({names}): a different "
            "model, seq_len, batch, cluster, space or trial settings. Move them away, give this sweep a new name, "
            "or start over with --fresh"
        )


def digest(path: Path) -> str:
    """The recorded sweep file's content hash, to notice an edit cheaply (`check_unchanged`)."""
    return hashlib.sha256(_read(path)).hexdigest()


def _read(path: Path) -> bytes:
    """The recorded sweep file, read as a file from elsewhere is (a FIFO put there would hang the sweep)."""
    try:
        return read_limited(path, max_bytes=MAX_SPEC_BYTES)
    except FileRefused as e:
        raise SweepError(f"{e}; the results folder's sweep.yaml must be the sweep file as run") from None


def check_unchanged(path: Path, known: str, *, identity: str, source: Path | str | None) -> str:
    """Before a trial starts (it re-reads the recorded sweep file): the file is as recorded, or edited
    without changing what is measured (a comment, the budget). Returns its hash, to compare next time."""
    from sweeper.results.identity import sweep_identity

    try:
        data = read_limited(path, max_bytes=MAX_SPEC_BYTES)
    except FileRefused as e:
        data, found = b"", f"unreadable: {str(e).removeprefix(f'{path}: ')}"
    now = hashlib.sha256(data).hexdigest()
    if data and now == known:
        return known
    if data:
        try:
            found = sweep_identity(parse_sweep(data, source=str(path)))
        except (SweepError, ValueError) as e:
            found = f"invalid: {' '.join(str(e).split())[:120]}"
    if found != identity:
        back = f"copy the sweep file back over it (`cp {source} {path}`)" if source else "put it back as it was"
        raise SweepError(
            f"{path} changed while the sweep ran (sweep identity {found}, this run's {identity}): the trials re-read it, "
            f"so no more are started; the results so far are kept. To go on, {back} and run `sweep run` again; "
            "to measure the new settings, start over with --fresh or give the sweep a new name"
        )
    return now
