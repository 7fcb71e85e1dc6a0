"""The Optuna study's storage, checked before anything is created, its errors made one line,
and an unreadable study set aside for `--rebuild-study`.

The Parquet rows are the record of a sweep; the study is the search's memory of them. Losing
the study must not force `--fresh` (which would throw the rows away too): every finished row is
told to a new study (`sweeper.search.study.rebuild_study`), so the sampler knows them and nothing reruns.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sweeper.errors import SweepError

SQLITE_MAGIC = b"SQLite format 3\x00"
_URL_SCHEMES = ("sqlite", "postgresql", "mysql", "oracle", "mssql")


def default_storage(root: Path) -> str:
    return f"sqlite:///{(root / 'optuna.db').resolve()}"


def sqlite_path(url: str) -> Path | None:
    """The file of a `sqlite:///PATH` URL (None for other storages, or in-memory SQLite)."""
    if not url.startswith("sqlite:///") or url in ("sqlite:///", "sqlite:///:memory:"):
        return None
    return Path(url.removeprefix("sqlite:///").split("?", 1)[0])


def check_storage(url: str, *, field: str = "search.storage", damaged_ok: bool = False) -> None:
    """A storage URL that is one, whose file (if any) is in an existing folder and is a database
    (`damaged_ok`: an unreadable one is let through, for `--rebuild-study` and `--fresh` to set aside)."""
    if url.endswith(".journal") or url.startswith("journal:"):
        path = Path(url.removeprefix("journal:"))
        if not path.parent.is_dir():
            raise SweepError(f"{field} {url!r}: folder {path.parent} does not exist")
        return
    scheme = url.split(":", 1)[0].split("+", 1)[0]
    if "://" not in url or scheme not in _URL_SCHEMES:
        raise SweepError(
            f"{field} {url!r} is not an Optuna storage URL; use sqlite:///PATH, postgresql://..., "
            "mysql://..., or a PATH.journal file"
        )
    db = sqlite_path(url)
    if db is None:
        return
    if not db.parent.is_dir():
        raise SweepError(f"{field} {url!r}: folder {db.parent} does not exist")
    if not damaged_ok:
        check_study_file(db)


def check_study_file(db: Path) -> None:
    """A study file that is missing (made later) or a SQLite database SQLite can read through:
    a garbage, truncated or partly overwritten one is one error line naming `--rebuild-study`."""
    if db.exists() and (not is_sqlite(db) or damage(db) is not None):
        raise SweepError(corrupt_message(db, damage(db) if is_sqlite(db) else None))


def damage(db: Path) -> str | None:
    """What SQLite's own check finds wrong in a database file (a truncated file, a page overwritten
    in the middle), None when it reads through. Read-only: the file is not changed."""
    if db.stat().st_size == 0:
        return None
    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=5)
        try:
            found = [str(r[0]) for r in con.execute("PRAGMA quick_check").fetchall()]
        finally:
            con.close()
    except sqlite3.OperationalError:  # locked by the `sweep run` that holds it, unreadable: not damage
        return None
    except sqlite3.Error as e:
        return " ".join(str(e).split())[:200]
    return None if found == ["ok"] else " ".join("; ".join(found).split())[:200]


def is_sqlite(path: Path) -> bool:
    """An empty file (SQLite creates it so) or one that starts with SQLite's header."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError:
        return False
    return head in (b"", SQLITE_MAGIC)


def corrupt_message(path: Path, detail: str | None = None) -> str:
    why = f" ({detail})" if detail else ""
    return (
        f"the Optuna study {path} is not a readable SQLite database{why}; the results in trials/ are intact. "
        "Run `sweep run ... --rebuild-study` to set it aside and rebuild the study from trials/"
    )


def set_aside(path: Path) -> Path:
    """`--rebuild-study`: move an unreadable study file away (kept for inspection), never delete it."""
    aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    path.replace(aside)
    for extra in ("-journal", "-wal", "-shm"):
        path.with_name(path.name + extra).unlink(missing_ok=True)
    return aside


@contextmanager
def storage_errors(storage: str) -> Iterator[None]:
    """A database or file-system error of the study (full disk, corrupt file, lost server) as one SweepError."""
    import sqlalchemy.exc
    from optuna.exceptions import StorageInternalError

    try:
        yield
    except (sqlalchemy.exc.SQLAlchemyError, sqlite3.Error, StorageInternalError) as e:
        cause = e.__cause__ if isinstance(e, StorageInternalError) and e.__cause__ else e
        detail = " ".join(str(getattr(cause, "orig", None) or cause).split())[:200]
        path = sqlite_path(storage)
        if path is not None and path.is_file() and (not is_sqlite(path) or damage(path) is not None):
            raise SweepError(corrupt_message(path, detail)) from None  # damaged: --rebuild-study repairs it
        hint = "the results already written are intact; fix the storage and run `sweep run` again"
        raise SweepError(f"the Optuna study ({storage}) failed: {detail}; {hint}") from None
