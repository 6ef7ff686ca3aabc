"""Tables in and out: a pandas, polars or Arrow table written where the engine reads it,
and a release read back as a DataFrame with the input's column types."""

import contextlib
import hashlib
import hmac
import os
import tempfile

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


def private_dir(name):
    """A folder only this user may read (0700), under the system's temporary folder."""
    root = os.path.join(tempfile.gettempdir(), f"rhosynth-{os.getuid()}")
    os.makedirs(root, mode=0o700, exist_ok=True)
    info = os.stat(root)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{root} is not this user's alone: refusing to write private data there")
    path = os.path.join(root, name)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _name_key():
    """This user's secret for naming input files (32 random bytes, 0600, made once)."""
    path = os.path.join(private_dir("keys"), "input-names")
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
def csv_input(data):
    """The table as a CSV file (readable by this user only) for the length of the block.
    A dataset's ledger is bound to the file its first charge read and shows its name, so
    the name is the same for the same table in every call, yet says nothing of it: an
    HMAC of its content under this user's own secret key (a plain hash would let anyone
    who reads the ledger test a guess of the table). Deleted after."""
    folder = private_dir("inputs")
    fd, scratch = tempfile.mkstemp(dir=folder, suffix=".part")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            to_pandas(data).to_csv(f, index=False, date_format="%Y-%m-%dT%H:%M:%S")
        digest = hmac.new(_name_key(), digestmod=hashlib.sha256)
        with open(scratch, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        path = os.path.join(folder, digest.hexdigest() + ".csv")
        os.replace(scratch, path)
    except BaseException:
        os.unlink(scratch)
        raise
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def read_release(prefix, manifest):
    """The release's one table (its manifest's parts) as an Arrow table, through pyarrow's
    filesystems: a local path, file://, or s3:// (credentials and endpoint from the
    environment, as the engine takes them)."""
    if "://" in prefix:
        filesystem, root = pafs.FileSystem.from_uri(prefix)
    else:
        filesystem, root = pafs.LocalFileSystem(), os.path.abspath(prefix)
    tables = [pq.read_table(f"{root.rstrip('/')}/{part['path']}", filesystem=filesystem) for part in manifest["parts"]]
    return pa.concat_tables(tables) if tables else pa.table({})


def like(table, spec, manifest, template=None):
    """A release as pandas, with the types of `template` (the input DataFrame) where it has
    the column, else the spec's: categories as categoricals in declared order, datetimes as
    datetimes, integers as nullable integers where values are missing."""
    frame = table.to_pandas()
    declared = {c["name"]: c for c in spec.get("schema", {}).get("columns", [])}
    written = {c["name"]: c["data_type"] for c in manifest.get("columns", [])}
    for name in frame.columns:
        if written.get(name, "").startswith("Timestamp") and pd.api.types.is_numeric_dtype(frame[name].dtype):
            # Parquet has no seconds unit: such a column is stored as seconds since 1970
            # (float where a value is missing).
            frame[name] = pd.to_datetime(frame[name], unit="s")
        column = declared.get(name, {})
        dtype = template[name].dtype if template is not None and name in template.columns else None
        frame[name] = _cast(frame[name], dtype, column)
    return frame


def _cast(series, dtype, column):
    kind = column.get("kind")
    if isinstance(dtype, pd.CategoricalDtype) or (dtype is None and kind == "categorical"):
        known = list(dtype.categories) if isinstance(dtype, pd.CategoricalDtype) else column.get("categories", [])
        extra = [v for v in pd.unique(series.dropna()) if v not in set(map(str, known))]
        categories = [*known, *extra]
        if isinstance(dtype, pd.CategoricalDtype) and known and not isinstance(known[0], str):
            # Declared categories are text in the spec; the input's were not.
            series = series.map({str(k): k for k in known}, na_action="ignore").where(series.notna())
            categories = [*known, *extra]
        return pd.Categorical(series, categories=categories, ordered=getattr(dtype, "ordered", False))
    if dtype is None:
        return series
    if pd.api.types.is_datetime64_any_dtype(dtype):
        tz = getattr(dtype, "tz", None)
        return series.dt.tz_localize("UTC").dt.tz_convert(tz) if tz is not None else series.astype(dtype)
    if pd.api.types.is_integer_dtype(dtype):
        return series.round().astype("Int64" if series.isna().any() else dtype)
    if pd.api.types.is_bool_dtype(dtype):
        return series.map({"true": True, "false": False, "True": True, "False": False, True: True, False: False})
    if pd.api.types.is_float_dtype(dtype):
        return series.astype(dtype)
    return series
