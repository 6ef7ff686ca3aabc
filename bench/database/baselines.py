"""The two baselines of a database job, from its spec (docs/database.md, Evaluation):

- `independent`: each table synthesized on its own by AIM (ε split evenly over the three
  jobs, each unit's rows capped as the database job caps them) and joined by random keys:
  each admission given a random synthetic patient, each chart a random admission.
- `flattened`: the root and its first child table joined into one table, a patient's
  admissions flattened into one row ("Direct": the marginals generator over histories
  of `max_per_parent` rows), at the job's ε; the vitals are left out.

    python3 baselines.py specs --spec SPEC --train DIR --out DIR   # writes the jobs' specs
    python3 baselines.py join --spec SPEC --out DIR               # joins their outputs
"""

import argparse
import copy
import glob
import os
import tomllib

import numpy as np
import pandas as pd


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    return repr(v)


def job(dataset, urls, unit, columns, order_by, epsilon, delta, generator, section, out, ledger, extra=""):
    cols = "\n".join("  " + toml_value({k: v for k, v in c.items() if k != "within"}) + "," for c in columns)
    order = f'order_by = "{order_by}"\n' if order_by else ""
    params = "\n".join(f"{k} = {toml_value(v)}" for k, v in section.items())
    return f"""[job]
dataset_id = "{dataset}"
partitions = 4
[input]
urls = {toml_value(urls)}
[schema]
unit_column = "{unit}"
{order}columns = [
{cols}
]
[privacy]
epsilon = {epsilon}
delta = {delta}
accountant = "rdp"
ledger = "{ledger}"
dataset_budget = {{ epsilon = 10.0, delta = 1e-5 }}
[generator]
name = "{generator}"
[generator.{generator}]
{params}
[output]
url = "{out}"
{extra}"""


def specs(spec, train, out):
    eps, delta = spec["privacy"]["epsilon"], spec["privacy"]["delta"]
    root = spec["schema"]["columns"]
    admissions, vitals = spec["tables"]
    reach = {"patients": 1, "admissions": admissions["max_per_parent"]}
    reach["vitals"] = reach["admissions"] * vitals["max_per_parent"]
    tables = {"patients": root, "admissions": admissions["columns"], "vitals": vitals["columns"]}
    for name, columns in tables.items():
        text = job(f"independent-{name}", [os.path.join(train, f"{name}.csv")], "subject_id", columns, None,
                   eps / 3, delta / 3, "aim", {"max_rows_per_unit": reach[name]}, os.path.join(out, "independent", name),
                   os.path.join(out, "ledger"))
        open(os.path.join(out, f"independent-{name}.toml"), "w").write(text)
    # Flattened: patients joined to their admissions, capped by the public rule.
    p = pd.read_csv(os.path.join(train, "patients.csv"))
    a = pd.read_csv(os.path.join(train, "admissions.csv"))
    a = a.sort_values(["subject_id", "admittime"], kind="stable").groupby("subject_id").head(admissions["max_per_parent"])
    joined = a.drop(columns=["hadm_id"]).merge(p, on="subject_id")
    joined.to_csv(os.path.join(out, "flattened.csv"), index=False)
    columns = [c for c in root] + [c for c in admissions["columns"] if c["name"] not in ("hadm_id", "subject_id")]
    text = job("flattened", [os.path.join(out, "flattened.csv")], "subject_id", columns, admissions["order_by"], eps,
               delta, "marginals", {"history_rows": admissions["max_per_parent"]}, os.path.join(out, "flattened"),
               os.path.join(out, "ledger"))
    open(os.path.join(out, "flattened.toml"), "w").write(text)


def read(path):
    parts = sorted(glob.glob(os.path.join(path, "*.parquet")))
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)


def written(frame, spec):
    """A frame with its datetime columns as ISO text, as input files hold them (a
    release's Parquet may hold them as seconds since the epoch)."""
    kinds = {c["name"]: c["kind"] for c in spec["schema"]["columns"]}
    kinds.update({c["name"]: c["kind"] for t in spec["tables"] for c in t["columns"]})
    frame = frame.copy()
    for c in frame.columns:
        if kinds.get(c) == "datetime" and frame[c].dtype.kind in "if":
            frame[c] = pd.to_datetime(frame[c], unit="s").dt.strftime("%Y-%m-%d %H:%M:%S")
    return frame


def join(spec, out):
    rng = np.random.default_rng(0)  # the baselines' keys: public randomness of a benchmark
    p = read(os.path.join(out, "independent", "patients"))
    a = read(os.path.join(out, "independent", "admissions"))
    v = read(os.path.join(out, "independent", "vitals"))
    p["subject_id"] = [f"p{i}" for i in range(len(p))]
    a["hadm_id"] = [f"a{i}" for i in range(len(a))]
    a["subject_id"] = rng.choice(p.subject_id.values, len(a))
    v["hadm_id"] = rng.choice(a.hadm_id.values, len(v))
    v["subject_id"] = a.set_index("hadm_id").subject_id.reindex(v.hadm_id).values
    folder = os.path.join(out, "independent-joined")
    os.makedirs(folder, exist_ok=True)
    for name, t in (("patients", p), ("admissions", a), ("vitals", v)):
        written(t, spec).to_csv(os.path.join(folder, f"{name}.csv"), index=False)
    # Flattened: each synthetic history is a patient (its first row's attributes) and its
    # rows the admissions.
    f = read(os.path.join(out, "flattened"))
    root = [c["name"] for c in spec["schema"]["columns"] if c["kind"] != "identifier"]
    f["hadm_id"] = [f"a{i}" for i in range(len(f))]
    p = f.groupby("subject_id", sort=False).first().reset_index()[["subject_id", *root]]
    a = f[["hadm_id", "subject_id", *[c for c in f.columns if c not in root and c not in ("hadm_id", "subject_id")]]]
    folder = os.path.join(out, "flattened-joined")
    os.makedirs(folder, exist_ok=True)
    written(p, spec).to_csv(os.path.join(folder, "patients.csv"), index=False)
    written(a, spec).to_csv(os.path.join(folder, "admissions.csv"), index=False)
    pd.DataFrame(columns=["subject_id", "hadm_id", "charttime", "heart_rate", "resp_rate", "spo2"]).to_csv(
        os.path.join(folder, "vitals.csv"), index=False)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("step", choices=["specs", "join"])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--train")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.spec, "rb") as f:
        spec = tomllib.load(f)
    os.makedirs(args.out, exist_ok=True)
    if args.step == "specs":
        specs(spec, os.path.abspath(args.train), os.path.abspath(args.out))
    else:
        join(spec, os.path.abspath(args.out))


if __name__ == "__main__":
    main()
