"""Where a user's profiles are kept, and what `sweep profile forget` may delete there. Pure.

One cache folder per user (`cache_dir`): measured profiles by GPU table key, learned ones in
`learned/`. A cached file steers every sweep of its user, so one that others own or may write is
refused (`check_cached`), and `forget` deletes only the regular files the tool wrote there (`deletable`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from sweeper.files import FileRefused, check_owned
from sweeper.profiles.profile import MEASURED, ProfileError, read_header


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """`${XDG_CACHE_HOME:-~/.cache}/sweep/profiles/`: measured profiles, and learned ones in `learned/`."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return Path(base) / "sweep" / "profiles"


def check_cached(path: Path) -> None:
    """Refuse a cached profile (measured or learned) that another user owns or others may write, or
    that sits in such a folder of the cache: whoever can write it steers every sweep of this user.
    A FileRefused line says how to make it the user's own."""
    top = cache_dir().parent  # <cache>/sweep: the folders below it are the tool's
    folders = [f for f in path.parents if f == top or top in f.parents]
    for p in [path, *folders]:
        if p.exists() or p.is_symlink():
            fix = (
                f"remove it (`rm {p}`) and measure again with `sweep profile`"
                if p == path
                else f"use a cache folder of your own (XDG_CACHE_HOME) or have {p} removed"
            )
            check_owned(p, fix=fix)


def deletable(path: Path, folder: Path, kind: str) -> Path:
    """`path` checked before `forget` deletes it: a regular file (not a link) of the user's, directly
    in `folder` of the cache, reached through no link from `<cache>/sweep` down (a linked folder is
    someone's elsewhere), whose `kind:` is `kind` (a file the tool wrote). Else one FileRefused line."""
    import stat

    top = cache_dir().parent
    folder = Path(os.path.abspath(folder))
    for f in [folder, *folder.parents]:
        if f != top and top not in f.parents:
            break
        try:
            st = f.lstat()
        except OSError as e:
            raise FileRefused(f"{f}: {e.strerror or e}; nothing deleted") from None
        if not stat.S_ISDIR(st.st_mode):
            what = "a link" if stat.S_ISLNK(st.st_mode) else "not a folder"
            raise FileRefused(f"{f}: {what}, not the cache's own folder; `forget` deletes nothing through it")
        if st.st_uid != os.geteuid():
            raise FileRefused(f"{f}: owned by user {st.st_uid}, not you; `forget` deletes nothing in it")
    path = Path(os.path.abspath(path))
    try:
        st = path.lstat()
    except OSError as e:
        raise FileRefused(f"{path}: {e.strerror or e}; nothing deleted") from None
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(f"{path}: not a regular file (a link or a folder); `forget` deletes cached profiles only")
    if path.parent != folder:
        raise FileRefused(f"{path}: not in the cache folder {folder}; `forget` deletes cached profiles only")
    if st.st_uid != os.geteuid():
        raise FileRefused(f"{path}: owned by user {st.st_uid}, not you; nothing deleted")
    try:
        found = read_header(path).get("kind", MEASURED)
    except ProfileError as e:
        raise FileRefused(f"not a {kind} profile ({e}); nothing deleted") from None
    if found != kind:
        raise FileRefused(f"{path}: a {found} profile, not a {kind} one; nothing deleted")
    return path


def cached_profile_path(gpu: str, env: Mapping[str, str] | None = None) -> Path:
    """Where `sweep profile` keeps the measured profile of a GPU table key, and where the model finds it."""
    return cache_dir(env) / f"{gpu}.profile.yaml"
