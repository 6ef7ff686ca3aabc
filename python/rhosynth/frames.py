"""Tables in and out: a pandas, polars or Arrow table written where the engine reads it,
and a release read back as a DataFrame with the input's column types."""

import contextlib
import fcntl
import hashlib
import hmac
import os
import re
import stat
import tempfile
import threading
import time

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq


def to_pandas(data):
    """A pandas DataFrame of a pandas, polars or pyarrow table."""
    if isinstance(data, pd.DataFrame):
        return data
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        return data.to_pandas()
    if type(data).__module__.startswith("polars"):
        return data.to_pandas()
    raise TypeError(f"data is a pandas, polars or pyarrow table, or a path or URL, not {type(data).__name__}")


def home():
    """This user's rhosynth folder: $RHOSYNTH_HOME, else ~/.rhosynth. It outlives reboots
    (the input names' key and the default ledger must)."""
    return os.environ.get("RHOSYNTH_HOME") or os.path.join(os.path.expanduser("~"), ".rhosynth")


def private_dir(name):
    """A folder of this user's rhosynth folder that only this user may read (0700), never
    reached through a symbolic link."""
    path = home()
    for part in (None, name):
        if part is not None:
            path = os.path.join(path, part)
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise PermissionError(f"{path} is not a folder of this user's alone: refusing to keep private data there")
    return path


def _name_key():
    """This user's secret for naming input files (32 random bytes, 0600, made once)."""
    path = os.path.join(private_dir("keys"), "input-names")
    if os.path.islink(path):
        raise PermissionError(f"{path} is a symbolic link: refusing it as a key")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        with open(path, "rb") as f:
            return f.read()
    key = os.urandom(32)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


@contextlib.contextmanager
def csv_input(data, dialect=None):
    """The table as a CSV file (readable by this user only) for the length of the block,
    written in the spec's CSV `dialect` (its `[input.csv]`: delimiter, header line, the
    first missing-value spelling), datetimes in UTC.

    A dataset's ledger is bound to the file its first charge read and shows its name, so
    the name is the same for the same table in every call, yet says nothing of it: an HMAC
    of its content under this user's own secret key (a plain hash would let anyone who
    reads the ledger test a guess of the table). Deleted after, unless another call still
    reads it (a shared lock while in use); what a killed call left is deleted by the next."""
    dialect = dialect or {}
    folder = private_dir("inputs")
    _sweep(folder)
    fd, scratch = tempfile.mkstemp(dir=folder, suffix=".part")
    fcntl.flock(fd, fcntl.LOCK_EX)  # being written: not a killed call's
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            _utc(to_pandas(data)).to_csv(
                f,
                index=False,
                sep=dialect.get("delimiter", ","),
                header=dialect.get("has_header", True),
                na_rep=(dialect.get("null_values") or [""])[0],
                date_format="%Y-%m-%dT%H:%M:%S",
            )
        digest = hmac.new(_name_key(), digestmod=hashlib.sha256)
        with open(scratch, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        path = os.path.join(folder, digest.hexdigest() + ".csv")
        # Locked before it is in place: a sweep never deletes it under this call.
        lock = open(path + ".lock", "a")
        fcntl.flock(lock, fcntl.LOCK_SH)
        os.replace(scratch, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(scratch)
        raise
    # A lock of its own (another open file) for the CLIs the call runs: held by whichever
    # of this process and them lives longest.
    passed = os.open(path + ".lock", os.O_RDONLY | os.O_NOFOLLOW)
    fcntl.flock(passed, fcntl.LOCK_SH)
    with _held_lock:
        _held.add(passed)
    try:
        yield path
    finally:
        with _held_lock:
            _held.discard(passed)
        os.close(passed)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        except BlockingIOError:
            pass  # another call reads it: the last one out deletes it
        finally:
            lock.close()


#: The locks of the input files this process's calls read: passed to the CLI they run,
#: so that a file stays while that CLI reads it, even when this process is killed.
_held = set()
_held_lock = threading.Lock()


def held_locks():
    """File descriptors of the input files' locks this process holds."""
    with _held_lock:
        return tuple(_held)


#: A half-written input (`.part`) is a killed call's when unlocked and this old (seconds):
#: its writer locks it as soon as it is made.
_PART_GRACE = 60


def _sweep(folder):
    """Deletes the input files of calls that were killed (a call deletes its own as it
    ends): those no live call (or CLI it ran) holds a lock on. Best effort: an entry that
    cannot be checked is left."""
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        try:
            if name.endswith(".csv"):
                _delete_unless_locked(path, path + ".lock")
            elif name.endswith(".part") and time.time() - os.lstat(path).st_mtime > _PART_GRACE:
                _delete_unless_locked(path, path)
        except OSError:
            continue


def _delete_unless_locked(path, lock_path):
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # a live call reads it
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _utc(frame):
    """Time-zone-aware datetime columns as UTC wall times (the engine reads no offsets)."""
    aware = [c for c in frame.columns if isinstance(frame[c].dtype, pd.DatetimeTZDtype)]
    if not aware:
        return frame
    frame = frame.copy()
    for c in aware:
        frame[c] = frame[c].dt.tz_convert("UTC").dt.tz_localize(None)
    return frame


#: A part's path as the engine writes it: a file name, or folders and a file name, under
#: the release's prefix (never absolute, never `..`).
_PART = re.compile(r"^(?:[A-Za-z0-9_.=-]+/)*[A-Za-z0-9_=-][A-Za-z0-9_.=-]*$")


def read_parts(prefix, parts):
    """A table of a release (its manifest's `parts`) as an Arrow table, through pyarrow's
    filesystems: a local path, file://, or s3:// (credentials and endpoint from the
    environment, as the engine takes them)."""
    if "://" in prefix:
        filesystem, root = pafs.FileSystem.from_uri(prefix)
    else:
        filesystem, root = pafs.LocalFileSystem(), os.path.abspath(prefix)
    for part in parts:
        if not _PART.match(part["path"]) or ".." in part["path"].split("/"):
            raise ValueError(f"the manifest names a part outside its release: {part['path']!r}")
    tables = [pq.read_table(f"{root.rstrip('/')}/{part['path']}", filesystem=filesystem) for part in parts]
    return pa.concat_tables(tables) if tables else pa.table({})


def like(table, columns, written, template=None):
    """A table of a release as pandas, with the types of `template` (the input DataFrame)
    where it has the column, else those of the spec's `columns`: categories as categoricals
    in declared order, datetimes as datetimes, integers as nullable integers where values
    are missing. `written`: the manifest's columns."""
    frame = table.to_pandas()
    declared = {c["name"]: c for c in columns}
    written = {c["name"]: c["data_type"] for c in written}
    for name in frame.columns:
        if written.get(name, "").startswith("Timestamp") and pd.api.types.is_numeric_dtype(frame[name].dtype):
            # Releases written before November 2026 stored datetimes as bare seconds since 1970
            # (Parquet has no seconds unit); later ones as millisecond timestamps.
            frame[name] = pd.to_datetime(frame[name], unit="s")
        column = declared.get(name, {})
        dtype = template[name].dtype if template is not None and name in template.columns else None
        frame[name] = _cast(frame[name], dtype, column)
    return frame


def _cast(series, dtype, column):
    kind = column.get("kind")
    if isinstance(dtype, pd.CategoricalDtype) or (dtype is None and kind == "categorical"):
        known = list(dtype.categories) if isinstance(dtype, pd.CategoricalDtype) else column.get("categories", [])
        names = set(map(str, known))
        extra = [v for v in pd.unique(series.dropna()) if v not in names]
        categories = [*known, *extra]
        if isinstance(dtype, pd.CategoricalDtype) and known and not isinstance(known[0], str):
            # Declared categories are text in the spec; the input's were not.
            lookup = {str(k): k for k in known}
            series = series.map(lambda v: lookup.get(v, v), na_action="ignore")
        return pd.Categorical(series, categories=categories, ordered=getattr(dtype, "ordered", False))
    if dtype is None:
        return series
    if pd.api.types.is_datetime64_any_dtype(dtype):
        tz = getattr(dtype, "tz", None)
        # An aware input went in as UTC wall times (`_utc`).
        return series.dt.tz_localize("UTC").dt.tz_convert(tz) if tz is not None else series.astype(dtype)
    if pd.api.types.is_integer_dtype(dtype):
        return series.round().astype("Int64" if series.isna().any() else dtype)
    if pd.api.types.is_bool_dtype(dtype):
        return series.map({"true": True, "false": False, "True": True, "False": False, True: True, False: False})
    if pd.api.types.is_float_dtype(dtype):
        return series.astype(dtype)
    return series
