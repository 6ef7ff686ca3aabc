"""Evaluates synthetic MIMIC-shaped databases (patients -> admissions -> vitals) against a
held-out real one: per-table fidelity, referential integrity, child counts per parent,
cross-table marginals, times inside their admission, lag-1 dynamics within an admission,
and a patient-level train-on-synthetic, test-on-real score (TSTR).

    python3 evaluate.py --spec SPEC --train DIR --test DIR NAME=DIR [NAME=DIR ...]

A DIR is a folder of `patients.csv`, `admissions.csv`, `vitals.csv`, or a rhosynth
database release (`<table>/part-*.parquet`). Real data (train and test) are capped by the
spec's public rule first (the first `max_per_parent` rows of each parent by `order_by`),
as the job reads them. Prints one table of figures and writes them as JSON (--json).
"""

import argparse
import glob
import json
import os
import tomllib

import numpy as np
import pandas as pd
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

TABLES = ("patients", "admissions", "vitals")


def load(path, tables=TABLES):
    out = {}
    for t in tables:
        csv = os.path.join(path, f"{t}.csv")
        if os.path.exists(csv):
            out[t] = pd.read_csv(csv)
        else:
            parts = sorted(glob.glob(os.path.join(path, t, "*.parquet")))
            out[t] = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    for t, cols in (("admissions", ("admittime", "dischtime")), ("vitals", ("charttime",))):
        for c in cols if t in out else ():
            # A release's Parquet holds seconds since the epoch (int64).
            numeric = out[t][c].dtype.kind in "if"
            out[t][c] = pd.to_datetime(out[t][c], unit="s") if numeric else pd.to_datetime(out[t][c])
    return out


def capped(db, spec):
    caps = {t["name"]: (t["max_per_parent"], t["parent"]["key"], t.get("order_by")) for t in spec["tables"]}
    p = db["patients"].drop_duplicates("subject_id")
    n, key, order = caps["admissions"]
    a = db["admissions"][db["admissions"].subject_id.isin(p.subject_id)]
    a = a.sort_values([key, order], kind="stable").groupby(key).head(n)
    n, key, order = caps["vitals"]
    v = db["vitals"].merge(a[["hadm_id", "subject_id"]], on=["hadm_id", "subject_id"])
    v = v.sort_values([key, order], kind="stable").groupby(key).head(n)
    return {"patients": p, "admissions": a, "vitals": v}


def columns(spec):
    root = [c for c in spec["schema"]["columns"]]
    return {"patients": root, **{t["name"]: t["columns"] for t in spec["tables"]}}


def binned(series, column):
    """A column's values as public bins: categories, or equal bins of its declared range."""
    if column["kind"] == "categorical":
        return series.astype("string").fillna("<missing>")
    lo, hi = column["min"], column["max"]
    if column["kind"] == "datetime":
        lo, hi = pd.Timestamp(lo).timestamp(), pd.Timestamp(hi).timestamp()
        series = series.astype("int64") / 1e9 if series.dtype.kind == "M" else series
    bins = column.get("bins", 32) if isinstance(column.get("bins", 32), int) else 32
    edges = np.linspace(lo, hi, bins + 1)
    return pd.Series(np.digitize(series.astype(float), edges[1:-1]), index=series.index).where(series.notna(), -1)


def tvd(a, b):
    pa, pb = a.value_counts(normalize=True), b.value_counts(normalize=True)
    idx = pa.index.union(pb.index)
    return 0.5 * float((pa.reindex(idx, fill_value=0) - pb.reindex(idx, fill_value=0)).abs().sum())


def joint_tvd(a, b):
    key = lambda frame: frame.apply(lambda column: column.map(str)).agg("|".join, axis=1)
    return tvd(key(a), key(b))


def child_counts(parents, children, key, parent_key=None):
    counts = children.groupby(key).size()
    return counts.reindex(parents[parent_key or key], fill_value=0).reset_index(drop=True)


def features(db):
    """One row per patient: attributes, admissions, their vitals' means, and the label
    (died in an admission), joined across the tables."""
    p, a, v = db["patients"], db["admissions"], db["vitals"]
    f = p.set_index("subject_id")[["age", "sex", "comorbidity"]].copy()
    f["sex"] = (f["sex"] == "M").astype(float)
    f["comorbidity"] = f["comorbidity"].map({"none": 0, "mild": 1, "severe": 2}).astype(float)
    f["admissions"] = a.groupby("subject_id").size().reindex(f.index, fill_value=0)
    f["emergency"] = (a.admission_type == "emergency").groupby(a.subject_id).mean().reindex(f.index)
    stay = (a.dischtime - a.admittime).dt.total_seconds() / 3600
    f["stay_h"] = stay.groupby(a.subject_id).mean().reindex(f.index)
    for c in ("heart_rate", "resp_rate", "spo2"):
        f[c] = v.groupby("subject_id")[c].mean().reindex(f.index)
    label = (a.outcome == "died").groupby(a.subject_id).any().reindex(f.index, fill_value=False)
    return f, label.astype(int)


def tstr(train, test):
    (x, y), (xt, yt) = features(train), features(test)
    out = {}
    for name, model in (("LR", LogisticRegression(max_iter=2000)), ("GBT", HistGradientBoostingClassifier())):
        if name == "LR":
            fill = x.mean().fillna(0.0)
            x_, xt_ = x.fillna(fill), xt.fillna(fill)
            mu, sd = x_.mean(), x_.std().replace(0, 1)
            x_, xt_ = (x_ - mu) / sd, (xt_ - mu) / sd
        else:
            x_, xt_ = x, xt
        if y.nunique() < 2:
            out[name] = float("nan")
            continue
        model.fit(x_, y)
        out[name] = float(roc_auc_score(yt, model.predict_proba(xt_)[:, 1]))
    return out


def lag_one(v):
    if len(v) < 2:
        return float("nan")
    v = v.sort_values(["hadm_id", "charttime"], kind="stable")
    prev = v.groupby("hadm_id").heart_rate.shift()
    ok = prev.notna() & v.heart_rate.notna()
    return float(np.corrcoef(prev[ok], v.heart_rate[ok])[0, 1])


def evaluate(real, syn, spec):
    cols = columns(spec)
    p, a, v = syn["patients"], syn["admissions"], syn["vitals"]
    m = {}
    # Per-table fidelity: mean 1-way TVD over the declared non-identifier columns.
    for t in TABLES:
        if len(syn[t]) == 0:  # a baseline without the table
            m[f"{t} 1-way TVD"] = float("nan")
            continue
        scores = [tvd(binned(real[t][c["name"]], c), binned(syn[t][c["name"]], c))
                  for c in cols[t] if c["kind"] != "identifier"]
        m[f"{t} 1-way TVD"] = float(np.mean(scores))
    # Referential integrity: every child's parent exists (and a chart's patient is its
    # admission's).
    adm_ok = a.subject_id.isin(p.subject_id)
    owner = a.set_index("hadm_id").subject_id
    chart_ok = v.hadm_id.isin(owner.index) & (v.subject_id.values == owner.reindex(v.hadm_id).values)
    m["integrity %"] = 100.0 * float((adm_ok.sum() + chart_ok.sum()) / (len(a) + len(v)))
    # Child counts per parent.
    ra, sa = child_counts(real["patients"], real["admissions"], "subject_id"), child_counts(p, a, "subject_id")
    m["admissions per patient TVD"] = tvd(ra, sa)
    rv, sv = child_counts(real["admissions"], real["vitals"], "hadm_id"), child_counts(a, v, "hadm_id")
    m["charts per admission TVD"] = tvd(rv // 4, sv // 4) if len(v) else float("nan")
    # Cross-table 2-way marginals: a patient attribute x the number of their admissions.
    def per_patient(db, counts):
        age = pd.Series(db["patients"].age.values).floordiv(10).astype("Int64")
        return pd.DataFrame({"age": age, "comorbidity": db["patients"].comorbidity.values, "n": counts.values})
    rp, sp = per_patient(real, ra), per_patient(syn, sa)
    m["age band x admissions TVD"] = joint_tvd(rp[["age", "n"]], sp[["age", "n"]])
    m["comorbidity x admissions TVD"] = joint_tvd(rp[["comorbidity", "n"]], sp[["comorbidity", "n"]])
    # Admission type x mean heart rate of its charts; comorbidity x mean SpO2.
    def mean_by(db, by_table, by, value):
        joined = db["vitals"].merge(db[by_table][[k for k in ("hadm_id", "subject_id", by) if k in db[by_table]]]
                                    .drop_duplicates(), on="hadm_id" if by_table == "admissions" else "subject_id")
        return joined.groupby(by)[value].mean()
    for by_table, by, value in (("admissions", "admission_type", "heart_rate"), ("patients", "comorbidity", "spo2")):
        r, s = mean_by(real, by_table, by, value), mean_by(syn, by_table, by, value)
        m[f"{by} x mean {value} abs error"] = float((r - s.reindex(r.index)).abs().mean()) if len(v) else float("nan")
    # Times inside their admission; a discharge at or after its admission.
    joined = v.merge(a[["hadm_id", "admittime", "dischtime"]], on="hadm_id")
    timed = joined.charttime.notna() & joined.admittime.notna() & joined.dischtime.notna()
    inside = (joined.charttime >= joined.admittime) & (joined.charttime <= joined.dischtime)
    m["charts inside their admission %"] = 100.0 * float(inside[timed].mean()) if len(v) else float("nan")
    both = a.admittime.notna() & a.dischtime.notna()
    m["discharge after admission %"] = 100.0 * float((a.dischtime >= a.admittime)[both].mean())
    m["heart rate lag-1 (real %.2f)" % lag_one(real["vitals"])] = lag_one(v)
    return m


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--train", required=True)
    parser.add_argument("--test", required=True)
    parser.add_argument("--json")
    parser.add_argument("synthetic", nargs="+")
    args = parser.parse_args()
    with open(args.spec, "rb") as f:
        spec = tomllib.load(f)
    train, test = capped(load(args.train), spec), capped(load(args.test), spec)
    results = {"real (train)": {**evaluate(test, train, spec), **{f"TSTR {k}": v for k, v in tstr(train, test).items()}}}
    for named in args.synthetic:
        name, path = named.split("=", 1)
        syn = load(path)
        results[name] = {**evaluate(test, syn, spec), **{f"TSTR {k}": v for k, v in tstr(syn, test).items()}}
    names = list(results)
    rows = list(results[names[0]])
    width = max(len(r) for r in rows)
    print(f"{'':{width}}  " + "  ".join(f"{n:>18}" for n in names))
    for r in rows:
        print(f"{r:{width}}  " + "  ".join(f"{results[n].get(r, float('nan')):>18.3f}" for n in names))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
