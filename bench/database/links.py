"""A skeptic's check of a database release's links (issue #65), with pandas alone: per
table, missing values where the real table has none; per admission, the stay's length
against its charts' count and against their mean heart rate; per patient, comorbidity
against the mean heart rate of their stays and each admission's charts. Real figures from the training cohort capped
as the job caps it (the first `max_per_parent` rows of each parent by `order_by`).

    python3 links.py --spec JOB.toml --real DIR --synthetic RELEASE
"""

import argparse
import json
import tomllib

import pandas as pd

from evaluate import load


def seconds(series):
    # A release's Parquet holds timestamps; the CSV text.
    return (pd.to_datetime(series) - pd.Timestamp(0)).dt.total_seconds()


def capped(db, spec):
    root = spec["schema"]["table"]
    for t in spec["tables"]:
        parent, key, order, cap = t["parent"]["table"], t["parent"]["key"], t["order_by"], t["max_per_parent"]
        rows = db[t["name"]][db[t["name"]][key].isin(db[parent][key])]
        rows = rows.assign(_order=seconds(rows[order])).sort_values([key, "_order"], kind="stable")
        db[t["name"]] = rows.groupby(key, sort=False).head(cap).drop(columns="_order")
    return db


def figures(db, spec):
    root, (admissions, charts) = spec["schema"]["table"], (t["name"] for t in spec["tables"])
    unit, hadm = spec["schema"]["unit_column"], spec["tables"][1]["parent"]["key"]
    a = db[admissions].copy()
    a["stay"] = seconds(a["dischtime"]) - seconds(a["admittime"])
    per_stay = db[charts].groupby(hadm).agg(charts=("heart_rate", "size"), hr=("heart_rate", "mean"))
    a = a.merge(per_stay, left_on=hadm, right_index=True, how="left").fillna({"charts": 0})
    p = db[root].merge(a.groupby(unit)["hr"].mean().rename("hr"), left_on=unit, right_index=True)
    comorbidity = pd.to_numeric(p["comorbidity"], errors="coerce")
    a = a.merge(db[root][[unit, "comorbidity"]], on=unit)
    return {
        "comorbidity × an admission's charts": pd.to_numeric(a["comorbidity"], errors="coerce").corr(a["charts"]),
        "stay × charts (Pearson)": a["stay"].corr(a["charts"]),
        "stay × charts (Spearman)": a["stay"].corr(a["charts"], method="spearman"),
        "stay × mean heart rate": a["stay"].corr(a["hr"]),
        "comorbidity × patient's mean heart rate": comorbidity.corr(p["hr"]),
        "missing values": {t: int(db[t].isna().sum().sum()) for t in db},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--real", required=True)
    parser.add_argument("--synthetic", required=True)
    args = parser.parse_args()
    spec = tomllib.load(open(args.spec, "rb"))
    tables = [spec["schema"]["table"]] + [t["name"] for t in spec["tables"]]
    real = figures(capped(load(args.real, tables), spec), spec)
    synthetic = figures(load(args.synthetic, tables), spec)
    print(json.dumps({"real": real, "synthetic": synthetic}, indent=1))


if __name__ == "__main__":
    main()
