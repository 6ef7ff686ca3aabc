"""AIM (McKenna, Mullins, Sheldon, Miklau 2022) on private-pgm's `mbi` 2.0 package.

The reference that `compare.sh` runs beside rhosynth's AIM generator. `mbi` ships the
estimation engine (Private-PGM) but not the AIM mechanism itself, so the mechanism is
written out here from the paper's Algorithm 1, with private-pgm's defaults: rounds 16·d,
90% of each round's ρ on measurement and 10% on selection, annealing when the model moves
less than the expected noise, a model-size limit that grows with the budget spent, and a
final fit at the full iteration count.

The data is discretised exactly as a rhosynth job spec declares it (the same bins, the same
missing and `__other__` buckets), read from the spec's TOML, and the synthetic rows are
written back in the input's CSV layout so that `rhosynth eval` scores both outputs alike.

This is a benchmark on data the operator owns: it reads the private rows directly and
nothing it writes is charged to any ledger.
"""

import argparse
import csv
import itertools
import json
import math
import os
import time
import tomllib

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_enable_compilation_cache", False)

import numpy as np  # noqa: E402
from mbi import Dataset, Domain, LinearMeasurement, estimation  # noqa: E402
from mbi.clique_utils import downward_closure  # noqa: E402
from mbi.junction_tree import greedy_order, hypothetical_model_size  # noqa: E402

OTHER = "__other__"


# --- the spec's public domain ---------------------------------------------------------


def integer_ranges(lo, hi, bins, default_bins):
    """Inclusive integer ranges, as rhosynth's `integer_binning`."""
    if isinstance(bins, list):
        starts = [math.ceil(e) for e in bins[:-1]]
        ranges = []
        for i, s in enumerate(starts):
            end = starts[i + 1] - 1 if i + 1 < len(starts) else hi
            if end >= s:
                ranges.append((s, end))
        return ranges
    count = bins if isinstance(bins, int) else default_bins
    values = hi - lo + 1
    if values <= count:
        return [(v, v) for v in range(lo, hi + 1)]
    return [(lo + k * values // count, lo + (k + 1) * values // count - 1) for k in range(count)]


class Column:
    def __init__(self, spec, default_bins):
        self.name = spec["name"]
        self.kind = spec["kind"]
        self.missing = spec.get("missing", "keep") == "keep"
        if self.kind == "categorical":
            self.categories = spec["categories"]
            self.other = spec.get("unknown", "reject") == "other"
            self.values = len(self.categories) + int(self.other)
        elif self.kind == "integer":
            self.lo, self.hi = math.ceil(spec["min"]), math.floor(spec["max"])
            self.ranges = integer_ranges(self.lo, self.hi, spec.get("bins"), default_bins)
            self.starts = [r[0] for r in self.ranges]
            self.values = len(self.ranges)
        elif self.kind == "real":
            self.lo, self.hi = float(spec["min"]), float(spec["max"])
            bins = spec.get("bins")
            if isinstance(bins, list):
                self.edges = [float(e) for e in bins]
            else:
                count = bins if isinstance(bins, int) else default_bins
                width = (self.hi - self.lo) / count
                self.edges = [self.lo + k * width for k in range(count)] + [self.hi]
            self.values = len(self.edges) - 1
        else:
            raise SystemExit(f"column {self.name}: kind {self.kind} is not supported by this benchmark")
        self.size = self.values + int(self.missing)

    def encode(self, raw, nulls):
        if raw in nulls or raw == "":
            if not self.missing:
                raise SystemExit(f"column {self.name}: a missing value under missing = reject")
            return self.values
        if self.kind == "categorical":
            if raw in self.categories:
                return self.categories.index(raw)
            if self.other:
                return len(self.categories)
            raise SystemExit(f"column {self.name}: undeclared category")
        v = min(max(float(raw), self.lo), self.hi)
        if self.kind == "integer":
            return int(np.searchsorted(self.starts, round(v), side="right")) - 1
        return min(int(np.searchsorted(self.edges, v, side="right")) - 1, self.values - 1)

    def decode(self, code, rng, null):
        """A value inside bin `code`, drawn as rhosynth's `decode_bin` draws it."""
        if self.missing and code == self.values:
            return null
        if self.kind == "categorical":
            return self.categories[code] if code < len(self.categories) else OTHER
        if self.kind == "integer":
            lo, hi = self.ranges[code]
            return str(int(rng.integers(lo, hi + 1)))
        lo, hi = self.edges[code], self.edges[code + 1]
        return repr(lo + rng.random() * (hi - lo))


def load_spec(path):
    with open(path, "rb") as f:
        spec = tomllib.load(f)
    params = spec.get("generator", {}).get("aim", {})
    default_bins = params.get("default_bins", 32)
    columns = [Column(c, default_bins) for c in spec["schema"]["columns"] if c["kind"] != "identifier"]
    if len(columns) != len(spec["schema"]["columns"]):
        raise SystemExit("identifier columns are not supported by this benchmark")
    return spec, columns


def read_rows(spec, spec_dir, columns):
    csv_spec = spec["input"].get("csv", {})
    nulls = set(csv_spec.get("null_values", []))
    comment = csv_spec.get("comment")
    suffix = csv_spec.get("strip_suffix")
    codes = [[] for _ in columns]
    for url in spec["input"]["urls"]:
        path = url if os.path.isabs(url) else os.path.join(spec_dir, url)
        with open(path, newline="") as f:
            reader = csv.reader(f)
            if csv_spec.get("has_header", True):
                next(reader)
            for record in reader:
                if not record or (comment and record[0].startswith(comment)):
                    continue
                if len(record) == 1 and not record[0].strip():
                    continue
                for k, (c, raw) in enumerate(zip(columns, record)):
                    raw = raw.strip()
                    if suffix and raw.endswith(suffix):
                        raw = raw[: -len(suffix)]
                    codes[k].append(c.encode(raw, nulls))
    domain = Domain([c.name for c in columns], [c.size for c in columns])
    return Dataset({c.name: np.array(v) for c, v in zip(columns, codes)}, domain)


# --- privacy: zCDP to (ε, δ), as private-pgm's cdp2adp ----------------------------------


def cdp_delta(rho, eps):
    """The tightest δ for ρ-zCDP at ε (Canonne, Kamath, Steinke 2020, Proposition 7)."""
    amin, amax = 1.01, (eps + 1) / (2 * rho) + 2
    for _ in range(1000):
        alpha = (amin + amax) / 2
        derivative = (2 * alpha - 1) * rho - eps + math.log1p(-1.0 / alpha)
        if derivative < 0:
            amin = alpha
        else:
            amax = alpha
    delta = math.exp((alpha - 1) * (alpha * rho - eps) + alpha * math.log1p(-1 / alpha)) / (alpha - 1.0)
    return min(delta, 1.0)


def cdp_rho(eps, delta):
    """The largest ρ whose ρ-zCDP guarantee implies (ε, δ)-DP."""
    lo, hi = 0.0, eps + 1
    for _ in range(1000):
        mid = (lo + hi) / 2
        if cdp_delta(mid, eps) <= delta:
            lo = mid
        else:
            hi = mid
    return lo


# --- AIM --------------------------------------------------------------------------------


def workload_weights(workload):
    """Every subset of a workload set, weighted by its overlap with the workload."""
    return {cl: float(sum(len(set(cl) & set(w)) for w in workload)) for cl in downward_closure(workload)}


def model_marginal(model, clique):
    """The model's marginal on `clique`, in the clique's order.

    A set inside one of the model's cliques is read off its marginals. Any other set is
    computed as mbi's `variable_elimination` computes it (the same greedy elimination
    order), in numpy: mbi's compiles one XLA program per set and per model, which on Adult
    took 4.5 minutes for the first round's 560 candidates and then failed with LLVM out of
    memory. (A single einsum over every potential, tried before, let numpy choose the
    order; its intermediates grew with the model until one round's marginals took over an
    hour.) The values are the same; only the route to them differs.
    """
    if model.marginals.supports(clique):
        return np.asarray(model.project(clique).datavector())
    index = {a: k for k, a in enumerate(model.domain.attributes)}
    factors = []
    for factor in model.potentials.tables.values():
        logits = np.asarray(factor.values)
        factors.append((np.exp(logits - logits.max()), tuple(factor.domain.attributes)))
    eliminate = [a for a in model.domain.attributes if a not in clique]
    order, _ = greedy_order(model.domain, [f[1] for f in factors] + [tuple(clique)], elim=eliminate)

    def contract(joined, kept):
        operands = [x for values, attrs in joined for x in (values, [index[a] for a in attrs])]
        return np.einsum(*operands, [index[a] for a in kept], optimize=len(joined) > 2)

    for z in order:
        joined = [f for f in factors if z in f[1]]
        if not joined:
            continue
        factors = [f for f in factors if z not in f[1]]
        kept = tuple(dict.fromkeys(a for f in joined for a in f[1] if a != z))
        values = contract(joined, kept)
        factors.append((values / values.max(), kept))
    joint = contract(factors, tuple(clique))
    return (joint * (float(model.total) / joint.sum())).ravel()


def exponential_mechanism(qualities, eps, sensitivity, rng):
    keys = list(qualities)
    q = np.array([qualities[k] for k in keys])
    logits = 0.5 * eps / sensitivity * (q - q.max())
    p = np.exp(logits)
    return keys[rng.choice(len(keys), p=p / p.sum())]


def aim(data, workload, rho, rounds, max_model_mb, iters, rng, log):
    candidates = workload_weights(workload)
    answers = {cl: np.asarray(data.project(cl).datavector()) for cl in candidates}
    oneway = [cl for cl in candidates if len(cl) == 1]
    sigma = math.sqrt(rounds / (2 * 0.9 * rho))
    eps = math.sqrt(8 * 0.1 * rho / rounds)
    engine = estimation.MirrorDescent()

    measurements = []
    rho_used = len(oneway) * 0.5 / sigma**2
    for cl in oneway:
        x = answers[cl]
        measurements.append(LinearMeasurement(x + rng.normal(0, sigma, x.size), cl, sigma))
    model = engine.estimate(data.domain, measurements, iters=iters)

    t, done = 0, False
    while not done:
        t += 1
        if rho - rho_used < 2 * (0.5 / sigma**2 + eps**2 / 8):
            remaining = rho - rho_used
            sigma = math.sqrt(1 / (2 * 0.9 * remaining))
            eps = math.sqrt(8 * 0.1 * remaining)
            done = True
        rho_used += eps**2 / 8 + 0.5 / sigma**2
        size_limit = max_model_mb * rho_used / rho
        cliques = [m.clique for m in measurements]
        closure = set(downward_closure(cliques))
        small = {
            cl: w
            for cl, w in candidates.items()
            if cl in closure or hypothetical_model_size(data.domain, cliques + [cl]) <= size_limit
        }
        qualities = {}
        for cl, w in small.items():
            bias = math.sqrt(2 / math.pi) * sigma * data.domain.size(cl)
            estimate = model_marginal(model, cl)
            qualities[cl] = w * (np.linalg.norm(answers[cl] - estimate, 1) - bias)
        cl = exponential_mechanism(qualities, eps, max(small.values()), rng)
        n = data.domain.size(cl)
        measurements.append(LinearMeasurement(answers[cl] + rng.normal(0, sigma, n), cl, sigma))
        before = model_marginal(model, cl)
        model = engine.estimate(data.domain, measurements, iters=iters, warm_start=model)
        after = model_marginal(model, cl)
        if np.linalg.norm(after - before, 1) <= sigma * math.sqrt(2 / math.pi) * n:
            sigma /= 2
            eps *= 2
        jax.clear_caches()  # each round's model compiles anew; keep the old programs' memory bounded
        log(f"round {t}: {cl}, sigma {sigma:.2f}, rho used {rho_used:.4f} of {rho:.4f}")
    model = engine.estimate(data.domain, measurements, iters=iters, warm_start=model)
    return model, t


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True, help="a rhosynth job spec (TOML) with [generator.aim]")
    parser.add_argument("--out", required=True, help="CSV to write, in the spec's input layout")
    parser.add_argument("--degree", type=int, default=3, help="workload: every set of this many columns")
    parser.add_argument("--max-model-mb", type=float, default=80.0, help="private-pgm's default, 80 MB")
    parser.add_argument("--iters", type=int, default=1000, help="mirror-descent iterations per fit")
    parser.add_argument("--seed", type=int, default=None, help="fixes the noise: a benchmark, never a release")
    args = parser.parse_args()

    spec, columns = load_spec(args.spec)
    data = read_rows(spec, os.getcwd(), columns)
    privacy = spec["privacy"]
    rho = cdp_rho(privacy["epsilon"], privacy["delta"])
    d = len(columns)
    rounds = spec.get("generator", {}).get("aim", {}).get("rounds", 16 * d)
    workload = list(itertools.combinations(data.domain.attributes, args.degree))
    rng = np.random.default_rng(args.seed)

    started = time.time()
    model, t = aim(data, workload, rho, rounds, args.max_model_mb, args.iters, rng, lambda m: print(m, flush=True))
    synth = model.synthetic_data()
    seconds = time.time() - started

    null = (spec["input"].get("csv", {}).get("null_values") or [""])[0]
    frame = synth.to_dict()
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f)
        if spec["input"].get("csv", {}).get("has_header", True):
            writer.writerow([c.name for c in columns])
        for i in range(synth.records):
            writer.writerow([c.decode(int(frame[c.name][i]), rng, null) for c in columns])
    print(json.dumps({"rho": rho, "rounds_run": t, "rows": int(synth.records), "fit_seconds": seconds}))


if __name__ == "__main__":
    main()
