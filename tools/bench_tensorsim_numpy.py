"""numpy's side of `adjoint bench tensorsim`: the closed forms of one bilinear layer's tensor
similarity (analysis/similarity/tensor_similarity.h) on the same shapes (d = 1024 inputs plus
the bias coordinate, hidden 64, 10 outputs, every slice), side by side with ours in one run.

  /usr/bin/python3 tools/bench_tensorsim_numpy.py --adjoint build/tools/adjoint --threads 1 --clock cpu
  /usr/bin/python3 tools/bench_tensorsim_numpy.py --ours ours.json     (from bench tensorsim --out)

The same formulas, in float64 as ours: each layer prepared once (its factors stacked as
[L; R], its own Isserlis terms and its self inner products: the cached norms), then a pair
is one stacked product G = [L_a; R_a] [L_b; R_b]^T, the core
1/2 (G_LL * G_RR + G_LR * G_RL), D_a core row-dotted with D_b, and for the Gaussian metric
t_a t_b + 2 <A|B> - 2 m_a m_b. A run's pairs: one product of each layer with all later ones.
Times are the median of --repeats runs after one warm-up, in the clock of the --ours run.
The ratio column is ours / numpy (time): below 1 adjoint is faster.
"""
import argparse
import atexit
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_peer  # noqa: E402

torch_peer.use_best_blas()  # before numpy loads OpenBLAS: the engine's kernel choice and thread count

import numpy as np  # noqa: E402


def prepare(left, right, down, gaussian):
    """A layer's cached terms: stacked factors, Isserlis' (D t) and (D m), its self inner products."""
    hidden = left.shape[0]
    layer = {"stacked": np.concatenate([left, right]), "down": down, "hidden": hidden, "gaussian": gaussian}
    layer["trace"] = down @ np.einsum("hc,hc->h", left, right)
    layer["mean"] = down @ (left[:, 0] * right[:, 0])
    layer["self"] = inner_from_gram(layer, layer, layer["stacked"] @ layer["stacked"].T)
    return layer


def inner_from_gram(a, b, g):
    """<A_o|B_o> per output from G = [L_a; R_a][L_b; R_b]^T."""
    ha, hb = a["hidden"], b["hidden"]
    core = 0.5 * (g[:ha, :hb] * g[ha:, hb:] + g[:ha, hb:] * g[ha:, :hb])
    frob = np.einsum("ok,ok->o", a["down"] @ core, b["down"])
    if a["gaussian"]:
        return a["trace"] * b["trace"] + 2 * frob - 2 * a["mean"] * b["mean"]
    return frob


def similarity(a, b, ab):
    """The cosine of the sums and of every slice."""
    return ab.sum() / np.sqrt(a["self"].sum() * b["self"].sum()), ab / np.sqrt(a["self"] * b["self"])


def pair(a, b):
    return similarity(a, b, inner_from_gram(a, b, a["stacked"] @ b["stacked"].T))


def run_pairs(layers):
    """Every pair of a run: one product of each layer with the stack of all later ones."""
    out = []
    for i, a in enumerate(layers[:-1]):
        later = np.concatenate([b["stacked"] for b in layers[i + 1:]])
        g = a["stacked"] @ later.T
        col = 0
        for b in layers[i + 1:]:
            width = b["stacked"].shape[0]
            out.append(similarity(a, b, inner_from_gram(a, b, g[:, col:col + width])))
            col += width
    return out


def random_layer(rng, d, hidden, outputs):
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32).astype(np.float64) / np.sqrt(shape[-1])
    return f32(hidden, d + 1), f32(hidden, d + 1), f32(outputs, hidden)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", help="the JSON of `adjoint bench tensorsim --out`")
    ap.add_argument("--adjoint", help="run this adjoint binary's bench tensorsim first (one run, both sides)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="cpu")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    if not args.ours and not args.adjoint:
        ap.error("give --ours FILE or --adjoint BIN")
    if args.adjoint:
        handle, path = tempfile.mkstemp(suffix=".json")
        os.close(handle)
        subprocess.run([args.adjoint, "--threads", str(args.threads), "bench", "tensorsim", "--only", "closed", "--clock",
                        args.clock, "--repeats", str(args.repeats), "--out", path], check=True)
        args.ours = path
        atexit.register(os.unlink, path)
    with open(args.ours) as f:
        ours = json.load(f)
    clock = torch_peer.CLOCKS[ours["clock"]]
    d, hidden, outputs, run_length = ours["inputs"], ours["hidden"], ours["outputs"], ours["run_length"]
    rng = np.random.default_rng(0)
    forms = [random_layer(rng, d, hidden, outputs) for _ in range(2)]
    run = []
    for k in range(run_length):
        t = k / (run_length - 1)
        run.append(tuple((1 - t) * x + t * y for x, y in zip(*forms)))

    def median_ms(fn, per=1):
        fn()
        times = []
        for _ in range(ours["repeats"]):
            start = clock()
            fn()
            times.append(clock() - start)
        times.sort()
        n = len(times)
        return 1e3 * (times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])) / per

    print(f"tensor similarity, one layer (d {d}, hidden {hidden}, {outputs} outputs, all slices), float64, "
          f"{ours['threads']} thread(s), {ours['clock']} clock")
    print(f"ours: OpenBLAS {ours['blas']}; numpy {np.__version__}: OpenBLAS {torch_peer.openblas_core()}")
    print(f"{'case':<14} {'metric':<9} {'ours ms':>9} {'numpy ms':>9} {'ours/numpy':>11}")
    pairs = run_length * (run_length - 1) // 2
    for case in ours["results"]:
        gaussian = case["metric"] == "gaussian"
        if case["case"] == "from_forms":
            ms = median_ms(lambda: pair(prepare(*forms[0], gaussian), prepare(*forms[1], gaussian)))
        elif case["case"] == "cached_norms":
            a, b = prepare(*forms[0], gaussian), prepare(*forms[1], gaussian)
            ms = median_ms(lambda: pair(a, b))
        else:
            layers = [prepare(*f, gaussian) for f in run]
            ms = median_ms(lambda: run_pairs(layers), per=pairs)
        print(f"{case['case']:<14} {case['metric']:<9} {case['ms_per_pair']:9.3f} {ms:9.3f} {case['ms_per_pair'] / ms:11.2f}")


if __name__ == "__main__":
    main()
