"""rhosynth from Python: DataFrames in, differentially private synthetic DataFrames out.

Every call runs the `rhosynth` binary the wheel ships (the same code, ledger and checks as
the CLI), on a standalone cluster on this machine. See docs/python.md.
"""

import dataclasses
import ipaddress
import json
import os
import tempfile
import urllib.parse
import uuid

from . import cli, frames
from . import spec as specs
from .errors import JobFailed, LedgerRefused, RhosynthError, SpecError

__all__ = [
    "draft",
    "synthesize",
    "evaluate",
    "audit",
    "ledger",
    "init_ledger",
    "Result",
    "Client",
    "Ledger",
    "RhosynthError",
    "SpecError",
    "LedgerRefused",
    "JobFailed",
]

#: Where outputs, evaluation reports and audits go unless a call names them (the CLI's).
DEFAULT_ROOT = "./rhosynth-out"
#: The ledger store unless a call names one: this user's, whatever the working folder (a
#: ledger made anew in another folder would start a dataset's budget over).
DEFAULT_LEDGER = os.path.join(frames.home(), "ledger")


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
    ledger=DEFAULT_LEDGER,
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
    ledger entry) and where the release was written. A database job's release is its
    tables: `data`, `read()` and `to_arrow()` give a dict of them by name, the root first."""

    manifest: dict
    output: str
    spec: dict
    template: object = dataclasses.field(default=None, repr=False)
    _table: object = dataclasses.field(default=None, repr=False)

    def _tables(self):
        """The release's tables as the manifest lists them: (name, manifest entry), one
        entry (the manifest itself, named by the spec's root table) when not a database."""
        root = self.spec.get("schema", {}).get("table")
        return [(t["name"], t) for t in self.manifest.get("tables") or []] or [(root, self.manifest)]

    def _one_or_all(self, by_name):
        return by_name if self.manifest.get("tables") else next(iter(by_name.values()))

    def to_arrow(self):
        """The synthetic table as a pyarrow Table (`polars.from_arrow` takes it); a
        database's tables as a dict of them."""
        if self._table is None:
            self._table = {name: frames.read_parts(self.output, t["parts"]) for name, t in self._tables()}
        return self._one_or_all(self._table)

    @property
    def data(self):
        """The synthetic table as a pandas DataFrame, with the input's column types."""
        return self.read()

    def read(self):
        """The release read where it was written (a path, file:// or s3://, through
        pyarrow's filesystems), as a pandas DataFrame: the input's column types where the
        job had an input table, else the spec's. A database's tables as a dict of them."""
        self.to_arrow()
        root = self.spec.get("schema", {})
        declared = {root.get("table"): root.get("columns", [])}
        declared.update({t["name"]: t.get("columns", []) for t in self.spec.get("tables", [])})
        # The table the call passed (the root) keeps its column types.
        return self._one_or_all({
            name: frames.like(self._table[name], declared.get(name, []), t.get("columns", []),
                              self.template if name == root.get("table") else None)
            for name, t in self._tables()
        })


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
    privacy["ledger"] = str(ledger) if ledger is not None else privacy.get("ledger", DEFAULT_LEDGER)
    if dataset is not None:
        job.setdefault("job", {})["dataset_id"] = dataset
    if budget is not None:
        _ensure_ledger(privacy["ledger"], job["job"]["dataset_id"], budget)
    job_id = job.get("job", {}).get("id") or f"py-{uuid.uuid4().hex[:12]}"
    job.setdefault("job", {})["id"] = job_id
    work = frames.private_dir("jobs")
    with _input(data, job) as path, tempfile.TemporaryDirectory(dir=work) as scratch:
        _read_from(job, data, path)
        job_path = _write_spec(job, scratch)
        # A killed kernel leaves no job running on without it.
        args = ["run", job_path, "--workers", str(workers), "--stop-with-parent", str(os.getpid())]
        if output is not None:
            args += ["--output", str(output)]
        # An [evaluation] report is the data owner's: kept where the CLI keeps it.
        args += ["--scratch", os.path.join(scratch, "scratch"), "--diagnostics", f"{DEFAULT_ROOT}/diagnostics"]
        manifest = cli.run(args, progress=progress, label=f"{job['generator']['name']} job {job_id}")
    template = None if isinstance(data, (str, os.PathLike)) else frames.to_pandas(data)
    # Where the engine wrote it, placeholders filled: the manifest says.
    return Result(manifest=manifest, output=manifest["output_url"], spec=job, template=template)


class Client:
    """A served coordinator (`rhosynth serve`) as one submitter: jobs on the datasets its
    operator declared and granted this submitter's token. `ca` is the CA that signed the
    coordinator's certificate (PEM path)."""

    def __init__(self, url, token=None, ca=None):
        _check_url(url, ca)
        self.url, self.token, self.ca = url, token, ca

    def __repr__(self):
        return f"Client({self.url!r}, token={'…' if self.token else None}, ca={self.ca!r})"

    def submit(self, spec, output=None, progress=True):
        """Submits a job (`rhosynth submit`) and follows it; returns its `Result`. The
        input, unit and ledger are the declared dataset's. An interrupt stops following
        (the served job runs on)."""
        job = specs.load(spec)
        args = ["submit", None, *self._reach()]
        if output is not None:
            args += ["--output", str(output)]
        with tempfile.TemporaryDirectory(dir=frames.private_dir("jobs")) as scratch:
            args[1] = _write_spec(job, scratch)
            label = f"{job['generator']['name']} job"
            manifest = cli.run(args, progress=progress, label=label, env=self._env(), detached=True)
        # Where the coordinator wrote it (under this submitter's output root unless the
        # spec named a place): the manifest says.
        return Result(manifest=manifest, output=manifest["output_url"], spec=job)

    def ledger(self, dataset):
        """Declared dataset `dataset`'s ledger as the coordinator shows this submitter: the
        budget, the total spent and every charge's cost and status; this submitter's own
        charges with their job ids and mechanisms, others with `None` there; no charge's
        time. `input` is `None`: the dataset's files are the operator's."""
        return _ledger(cli.run(["ledger", "show", "--dataset", dataset, *self._reach()], env=self._env()))

    def _reach(self):
        return ["--coordinator", self.url, *(["--tls-ca", str(self.ca)] if self.ca is not None else [])]

    def _env(self):
        return {"RHOSYNTH_TOKEN": self.token} if self.token is not None else None


@dataclasses.dataclass
class Ledger:
    """A dataset's privacy ledger as `rhosynth ledger show` reads it."""

    dataset: str
    budget: dict
    spent: dict
    remaining_epsilon: float
    charges: list
    input: "list | None"


def ledger(store, dataset):
    """`dataset`'s ledger in `store` (a path, file:// or s3:// URL): the data owner's view."""
    return _ledger(cli.run(["ledger", "show", "--dataset", dataset, "--store", str(store)]))


def _ledger(shown):
    return Ledger(
        dataset=shown["dataset"],
        budget=shown["budget"],
        spent=shown["spent"],
        remaining_epsilon=shown["remaining_epsilon"],
        charges=shown["charges"],
        input=shown.get("input"),
    )


def _check_url(url, ca):
    """A coordinator's URL: https, or http to a loopback address only and then without a
    CA (it would not be used); never with user information (which names another host)."""
    parts = urllib.parse.urlsplit(url)
    if "@" in parts.netloc:
        raise ValueError(f"a coordinator URL names no user: {url}")
    if parts.scheme == "https":
        return
    try:
        loopback = ipaddress.ip_address(parts.hostname or "").is_loopback
    except ValueError:
        loopback = parts.hostname == "localhost"
    if parts.scheme != "http" or not loopback:
        raise ValueError(f"{url}: use https:// (with ca=) for a coordinator that is not on this machine")
    if ca is not None:
        raise ValueError(f"{url}: ca= is for an https:// coordinator; over http it would not be used")


def _ensure_ledger(store, dataset, budget):
    try:
        ledger(store, dataset)
    except SpecError:
        init_ledger(store, dataset, *budget)


def evaluate(real_test, synthetic, spec=None, train=None, out=None):
    """The evaluation report (`rhosynth eval`) of `synthetic` (a `Result`, a table, or a
    release's prefix or a file) against held-out real rows `real_test`, and the real
    training rows `train` (default: a `Result`'s input table, else the spec's input). The
    report is computed on private data and is NOT differentially private: for the data
    owner. `out` keeps report.json and report.html there. Returns the report as a dict."""
    if isinstance(synthetic, Result):
        spec = synthetic.spec if spec is None else spec
        train = synthetic.template if train is None else train
        synthetic = synthetic.output
    if spec is None:
        raise TypeError("evaluate needs the job's spec (or a Result, which carries it)")
    job = specs.load(spec)
    work = frames.private_dir("jobs")
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        report = out or os.path.join(scratch, "report")
        with _input(real_test, job) as test, _input(synthetic, job) as drawn, _optional_input(train, job) as train_path:
            if any(not isinstance(t, (str, os.PathLike, type(None))) for t in (real_test, synthetic, train)):
                job.setdefault("input", {})["format"] = "csv"
            args = ["eval", "--spec", _write_spec(job, scratch), "--test", test, "--synthetic", drawn, "--out", report]
            if train_path is not None:
                args += ["--train", train_path]
            summary = cli.run(args)
        with open(os.path.join(report, "report.json"), encoding="utf-8") as f:
            full = json.load(f)
    full["summary"] = summary
    if out is not None:
        full["html"] = os.path.join(out, "report.html")
    return full


def audit(spec, data=None, canaries=1000, score="pairs", workers=2, out=None, **options):
    """An empirical privacy audit of `spec`'s mechanism (`rhosynth audit`): the job run once
    with canaries, on `data` (a table or files with the spec's schema; default the spec's
    input), and the ε its release proves. Returns the report as a dict; its `passed` says
    whether it is consistent with the claimed ε. Other options are the CLI's (`guesses=`,
    `canary_rows=`)."""
    job = specs.load(spec)
    work = frames.private_dir("jobs")
    with tempfile.TemporaryDirectory(dir=work) as scratch, _optional_input(data, job) as stand_in:
        if stand_in is not None:
            _read_from(job, data, stand_in)
        args = ["audit", _write_spec(job, scratch), "--canaries", str(canaries), "--score", score]
        args += ["--workers", str(workers), "--out", str(out or os.path.join(DEFAULT_ROOT, "audit"))]
        if stand_in is not None:
            args += ["--data", stand_in]
        for key, value in options.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        return cli.run(args, allowed=(cli.EXIT_AUDIT_FAILED,))


def _read_from(job, data, path):
    """Points the spec's input at `path`; a table was written as CSV in the spec's own
    dialect (`frames.csv_input`), so only the format is said."""
    job.setdefault("input", {})["urls"] = [path]
    if not isinstance(data, (str, os.PathLike)):
        job["input"]["format"] = "csv"


def _write_spec(job, folder):
    path = os.path.join(folder, "job.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(specs.dumps(job))
    return path


class _Path:
    """A path or URL the engine reads as it is."""

    def __init__(self, path):
        self.path = None if path is None else str(path)

    def __enter__(self):
        return self.path

    def __exit__(self, *_):
        return False


def _input(data, job=None):
    """A path or URL as it is; a table as a CSV file in `job`'s dialect."""
    if isinstance(data, (str, os.PathLike)):
        return _Path(data)
    return frames.csv_input(data, (job or {}).get("input", {}).get("csv"))


def _optional_input(data, job=None):
    return _Path(None) if data is None else _input(data, job)
