"""Issue 48: decoding bounded by what is decoded, not by what a file says it holds. A row file whose
footer claims 1,000 bytes for 40 MiB, a replay table of a few kilobytes that decompresses to 80 MiB,
and one whose dictionary repeats a long string: each refused in one line before it is expanded."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from sweeper.files import FileRefused
from sweeper.results.rows import MAX_ROW_BYTES, read_row_file
from tests.conftest import SPACES
from tests.faults.helpers import sweep
from tests.faults.test_hardening import one_line_error


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _padded(n: int, size: int) -> bytes:
    """`n` as a Thrift varint of exactly `size` bytes (continuation bytes of zero bits: still valid)."""
    enc = bytearray(_varint(n))
    while len(enc) < size:
        enc[-1] |= 0x80
        enc.append(0)
    return bytes(enc)


def lying_file(path: Path, table: pa.Table, claim: int = 1000) -> Path:
    """`table` as Parquet (zstd, no dictionary) whose footer claims `claim` bytes for its row group and
    its column chunks: the sizes a reader that trusts the footer checks."""
    pq.write_table(table, path, compression="zstd", use_dictionary=False)
    data = bytearray(path.read_bytes())
    meta = pq.read_metadata(path)
    sizes = {meta.row_group(0).total_byte_size} | {
        meta.row_group(0).column(i).total_uncompressed_size for i in range(meta.num_columns)
    }
    length = struct.unpack("<I", data[-8:-4])[0]
    footer = bytes(data[-8 - length : -8])
    for size in (s for s in sizes if s > 1 << 20):  # the big ones: a 4-byte varint, found only where it is
        enc = _varint(size << 1)  # zigzag i64
        footer = footer.replace(enc, _padded(claim << 1, len(enc)))
    data[-8 - length : -8] = footer
    path.write_bytes(bytes(data))
    assert pq.read_metadata(path).row_group(0).total_byte_size == claim  # the edit took
    return path


def test_a_row_file_whose_footer_lies_is_refused_by_its_pages(tmp_path: Path):
    big = 40 << 20
    path = lying_file(tmp_path / "trial-00000.parquet", pa.table({"error": ["a" * big]}))
    assert path.stat().st_size < 10_000
    with pytest.raises(FileRefused) as info:
        read_row_file(path)
    assert str(info.value).startswith(f"{path}: its pages decompress to 4194")
    assert str(info.value).endswith(f"bytes; at most {MAX_ROW_BYTES} are decoded here")


def test_a_row_file_with_a_lying_footer_is_skipped_by_status(ran_ex: Path, tmp_path: Path):
    trials = tmp_path / "results" / "ex" / "trials"
    row = pq.read_table(trials / "trial-00000.parquet")
    i = row.schema.get_field_index("error")
    row = row.set_column(i, row.schema.field(i), pa.array(["a" * (40 << 20)], type=pa.string()))
    path = trials / "trial-00000.parquet"
    path.unlink()
    lying_file(path, row).chmod(0o600)
    r = sweep("status", str(ran_ex), cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-1500:]
    assert f"skipped {path}: its pages decompress to" in " ".join(r.stderr.split()), r.stderr


def _replay_sweep(tmp_path: Path, table: pa.Table) -> Path:
    pq.write_table(table, tmp_path / "t.parquet", compression="zstd")
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec.update(
        name="rt", results_dir=str(tmp_path / "r"), launcher={"kind": "replay", "table": str(tmp_path / "t.parquet")}
    )
    path = tmp_path / "rt.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize(
    ("table", "words"),
    [
        # 80 MiB of one string, a few kilobytes of zstd
        (
            pa.table({"micro_batch_size": [1], "status": ["failed"], "error": ["a" * (80 << 20)]}),
            "bytes once decompressed",
        ),
        # 100 kB repeated 2,000 times by the dictionary's indices: 200 MB from about 20 kB
        (
            pa.table({"micro_batch_size": [1] * 2000, "status": ["failed"] * 2000, "error": ["b" * 100_000] * 2000}),
            "its strings expand to 200012000 bytes",  # and 2,000 times "failed"
        ),
    ],
)
def test_a_replay_table_that_expands_is_refused_before_it_is_decoded(tmp_path: Path, table: pa.Table, words: str):
    spec = _replay_sweep(tmp_path, table)
    assert (tmp_path / "t.parquet").stat().st_size < 100_000
    r = sweep("run", str(spec), "--dry-run", cwd=tmp_path)
    line = one_line_error(r)
    assert f"launcher.table: {tmp_path / 't.parquet'}: " in line and words in line, line
    assert f"at most {64 << 20} are decoded here" in line, line


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a folder to another user needs root")
def test_another_users_results_folder_is_one_line(tmp_path: Path):
    """As root nothing is denied, so the PermissionError a colleague's folder (mode 700) gives any
    other user is made here as the OS makes it; `main` turns it into this one line, exit 2."""
    from sweeper.cli import denied

    folder = tmp_path / "results" / "theirs"
    folder.mkdir(parents=True)
    os.chown(folder, 4242, 4242)
    line = denied(PermissionError(13, "Permission denied", str(folder / "trials")))
    assert line.startswith(f"{folder / 'trials'}: Permission denied;")
    os.chown(folder.parent, 4242, 4242)
    line = denied(PermissionError(13, "Permission denied", str(folder)))
    assert line.startswith(f"{folder}: Permission denied (owned by user 4242, not you: 0); ") and "\n" not in line
