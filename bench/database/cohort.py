"""A relational cohort for the database scale benchmark, written as a stream (one patient
at a time, nothing held): patients -> admissions -> charts, MIMIC's column names.

It is not `rhosynth simulate --relational` (the demo): a latent frailty drives the
comorbidity, the number of admissions (1-8), emergencies, the stay's length, death and
worse vitals; 3-40 charts an admission, AR(1) within it (lag-1 0.75). Simulated people,
so seeded.

    python3 cohort.py --patients 100000 --seed 1 DIR
"""

import argparse
import math
import os
import random
from datetime import datetime, timedelta

START = datetime(2024, 1, 1)
TIME = "%Y-%m-%d %H:%M:%S"


def poisson(rng, lam):
    # Knuth's method: lam stays below 10 here.
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def write(patients, seed, out):
    rng = random.Random(seed)
    os.makedirs(out, exist_ok=True)
    hadm = 0
    with open(f"{out}/patients.csv", "w") as pf, open(f"{out}/admissions.csv", "w") as af, open(
        f"{out}/charts.csv", "w"
    ) as cf:
        pf.write("subject_id,anchor_age,gender,comorbidity,insurance\n")
        af.write("hadm_id,subject_id,admittime,dischtime,admission_type,hospital_expire_flag\n")
        cf.write("subject_id,hadm_id,charttime,heart_rate,resp_rate,spo2,temperature\n")
        for p in range(patients):
            subject = 10_000_000 + p
            age = rng.randint(18, 91)
            frailty = max(0.0, min(2.0, (age - 18) / 60 + rng.gauss(0, 0.35)))
            comorbidity = min(3, int(frailty * 1.6 + rng.random()))
            gender = "F" if rng.random() < 0.52 else "M"
            insurance = rng.choices(["Medicare", "Medicaid", "Other"], [0.3 + 0.3 * (age > 65), 0.2, 0.5])[0]
            pf.write(f"{subject},{age},{gender},{comorbidity},{insurance}\n")
            admissions = min(8, 1 + poisson(rng, 0.2 + 1.0 * frailty))
            at = START + timedelta(hours=rng.randint(0, 24 * 365))
            for _ in range(admissions):
                hadm += 1
                kind = rng.choices(["EMERGENCY", "URGENT", "ELECTIVE"], [0.35 + 0.25 * frailty, 0.25, 0.4])[0]
                hours = min(24 * 40, max(6.0, 30 * math.exp(0.6 * frailty + rng.gauss(0, 0.6)) * (1.4 if kind == "EMERGENCY" else 1)))
                leave = at + timedelta(hours=hours)
                died = int(rng.random() < 0.015 + 0.06 * frailty * frailty + 0.03 * (kind == "EMERGENCY"))
                af.write(f"{20_000_000 + hadm},{subject},{at.strftime(TIME)},{leave.strftime(TIME)},{kind},{died}\n")
                charts = min(40, 3 + poisson(rng, min(9.0, 4 + 0.08 * hours)) + poisson(rng, 3 * frailty))
                hr, rr, sp, tc = (rng.gauss(0, 1) for _ in range(4))
                times = sorted(rng.random() for _ in range(charts))
                for u in times:
                    hr, rr, sp, tc = (0.75 * x + 0.66 * rng.gauss(0, 1) for x in (hr, rr, sp, tc))
                    sick = frailty + 0.8 * died
                    cf.write(
                        f"{subject},{20_000_000 + hadm},{(at + timedelta(hours=u * hours)).strftime(TIME)},"
                        f"{round(78 + 9 * sick + 11 * hr)},{round(16 + 2.5 * sick + 3 * rr)},"
                        f"{min(100, round(97 - 1.6 * sick + 1.8 * sp))},{36.8 + 0.3 * sick + 0.4 * tc:.1f}\n"
                    )
                if died:
                    break
                at = leave + timedelta(hours=24 * rng.expovariate(1 / 90))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("out")
    args = parser.parse_args()
    write(args.patients, args.seed, args.out)
