"""rhosynth from Python: DataFrames in, differentially private synthetic DataFrames out.

Every call runs the `rhosynth` binary the wheel ships (the same code, ledger and checks as
the CLI), on a standalone cluster on this machine. See docs/python.md.
"""

import dataclasses
import os
import tempfile
import uuid

from . import cli, frames
from . import spec as specs
from .errors import JobFailed, LedgerRefused, RhosynthError, SpecError

__all__ = [
    "draft",
    "synthesize",
    "ledger",
    "init_ledger",
    "Result",
    "Ledger",
    "RhosynthError",
    "SpecError",
    "LedgerRefused",
    "JobFailed",
]

#: Where ledgers, outputs and scratch go unless a call names them (the CLI's default).
DEFAULT_ROOT = "./rhosynth-out"


def init_ledger(store, dataset, epsilon, delta, adjacency="add-remove"):
    """Creates `dataset`'s ledger in `store` with its total budget (ε, δ); refused if one
    exists. Returns the `Ledger`."""
    args = ["ledger", "init", "--dataset", dataset, "--store", str(store)]
    cli.run(args + ["--epsilon", repr(float(epsilon)), "--delta", repr(float(delta)), "--adjacency", adjacency])
    return ledger(store, dataset)


def draft(
    data,
    unit_column=None,
    epsilon=None,
    dataset="dataset",
    ledger=f"{DEFAULT_ROOT}/ledger",
    budget=None,
    delta=1e-6,
    row_level=False,
    max_rows_per_unit=1,
    **options,
):
    """A job spec drafted from a table's columns: its domains released with DP at
    `epsilon` and charged to `dataset`'s ledger (`rhosynth schema draft`). Without
    `epsilon` the domains are the data's own, marked private, and the spec does not run
    until they are replaced. `budget=(ε, δ)` creates the ledger when there is none.
    Other options are the CLI's (`bins=`, `max_categories=`, `min_share=`, `generator=`,
    `epsilon_job=`). Returns the spec as a dict."""
    if epsilon is not None and budget is not None:
        _ensure_ledger(ledger, dataset, budget)
    out = os.path.join(frames.private_dir("drafts"), f"{uuid.uuid4().hex}.toml")
    args = ["schema", "draft", "--out", out, "--max-rows-per-unit", str(max_rows_per_unit)]
    if unit_column is not None:
        args += ["--unit-column", unit_column]
    if row_level:
        args.append("--row-level")
    if epsilon is not None:
        args += ["--epsilon", repr(float(epsilon)), "--delta", repr(float(delta)), "--dataset", dataset]
        args += ["--store", str(ledger)]
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    try:
        with _input(data) as path:
            cli.run(args[:2] + [path] + args[2:])
        return specs.load(out)
    finally:
        if os.path.exists(out):
            os.unlink(out)


@dataclasses.dataclass
class Result:
    """A finished job: the synthetic table, the release's manifest (ε, δ, mechanisms, the
    ledger entry) and where the release was written."""

    manifest: dict
    output: str
    spec: dict
    template: object = dataclasses.field(default=None, repr=False)
    _table: object = dataclasses.field(default=None, repr=False)

    def to_arrow(self):
        """The synthetic table as a pyarrow Table (`polars.from_arrow` takes it)."""
        if self._table is None:
            self._table = frames.read_release(self.output, self.manifest)
        return self._table

    @property
    def data(self):
        """The synthetic table as a pandas DataFrame, with the input's column types."""
        return frames.like(self.to_arrow(), self.spec, self.manifest, self.template)


def synthesize(
    data,
    spec,
    generator=None,
    epsilon=None,
    ledger=None,
    dataset=None,
    budget=None,
    output=None,
    workers=2,
    progress=True,
):
    """Runs a job on `data` (a pandas, polars or pyarrow table, or a path or URL) with
    `spec` (a dict, a TOML string or a path), on a standalone cluster of `workers` local
    workers. `generator`, `epsilon`, `ledger` and `dataset` override the spec's; `budget=(ε,
    δ)` creates the ledger when there is none. Shows progress (rounds, ε spent, ETA); an
    interrupt stops the job with nothing released. Returns a `Result`."""
    job = specs.load(spec)
    privacy = job.setdefault("privacy", {})
    if generator is not None:
        job.setdefault("generator", {})["name"] = generator
    if epsilon is not None:
        privacy["epsilon"] = float(epsilon)
    if ledger is not None:
        privacy["ledger"] = str(ledger)
    if dataset is not None:
        job.setdefault("job", {})["dataset_id"] = dataset
    if budget is not None:
        _ensure_ledger(privacy.get("ledger", f"{DEFAULT_ROOT}/ledger"), job["job"]["dataset_id"], budget)
    job_id = job.get("job", {}).get("id") or f"py-{uuid.uuid4().hex[:12]}"
    job.setdefault("job", {})["id"] = job_id
    work = frames.private_dir("jobs")
    out = output or os.path.join(DEFAULT_ROOT, job["job"]["dataset_id"], job_id)
    with _input(data) as path, tempfile.TemporaryDirectory(dir=work) as scratch:
        job.setdefault("input", {})["urls"] = [path]
        job_path = os.path.join(scratch, "job.toml")
        with open(job_path, "w", encoding="utf-8") as f:
            f.write(specs.dumps(job))
        args = ["run", job_path, "--workers", str(workers), "--output", out]
        # An [evaluation] report is the data owner's: kept where the CLI keeps it.
        args += ["--scratch", os.path.join(scratch, "scratch"), "--diagnostics", f"{DEFAULT_ROOT}/diagnostics"]
        manifest = cli.run(args, progress=progress, label=f"{job['generator']['name']} job {job_id}")
    template = None if isinstance(data, (str, os.PathLike)) else frames.to_pandas(data)
    return Result(manifest=manifest, output=out, spec=job, template=template)


@dataclasses.dataclass
class Ledger:
    """A dataset's privacy ledger as `rhosynth ledger show` reads it."""

    dataset: str
    budget: dict
    spent: dict
    remaining_epsilon: float
    charges: list
    input: list


def ledger(store, dataset):
    """`dataset`'s ledger in `store` (a path, file:// or s3:// URL)."""
    shown = cli.run(["ledger", "show", "--dataset", dataset, "--store", str(store)])
    return Ledger(
        dataset=shown["dataset"],
        budget=shown["budget"],
        spent=shown["spent"],
        remaining_epsilon=shown["remaining_epsilon"],
        charges=shown["charges"],
        input=shown["input"],
    )


def _ensure_ledger(store, dataset, budget):
    try:
        ledger(store, dataset)
    except SpecError:
        init_ledger(store, dataset, *budget)


class _Path:
    """A path or URL the engine reads as it is."""

    def __init__(self, path):
        self.path = str(path)

    def __enter__(self):
        return self.path

    def __exit__(self, *_):
        return False


def _input(data):
    return _Path(data) if isinstance(data, (str, os.PathLike)) else frames.csv_input(data)
