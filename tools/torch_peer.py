"""A fair PyTorch peer for the benchmarks: the same OpenBLAS kernels the engine uses.

Debian's PyTorch does its GEMMs in the system OpenBLAS. OpenBLAS 0.3.21 does not know some
newer CPUs and falls back to generic kernels (Prescott, ...), several times slower; the
engine re-selects the kernels for itself (engine/gemm.cpp: SkylakeX where the CPU has
AVX-512, Haswell where it has AVX2 and FMA). Here the peer gets the same choice, made the
same way, before torch loads: the library is probed with ctypes and, if it chose a generic
core, the script re-runs itself with OPENBLAS_CORETYPE set (and OMP_WAIT_POLICY=PASSIVE, see
use_best_blas). A user's own settings are respected, as the engine respects them.

    import torch_peer
    torch_peer.use_best_blas()      # before `import torch`
    import torch
    peer = torch_peer.describe(torch)   # {"blas": "Haswell", "cpu_capability": "AVX2", ...}
"""
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time

GENERIC_CORES = {"Prescott", "Core2", "Nehalem", "Sandybridge"}
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # cpu: process CPU time (a duration at 1 thread)
_MARK = "ADJOINT_PEER_BLAS_CHOSEN"


def openblas_core():
    """The kernel family the process's OpenBLAS uses (loads it if torch has not yet)."""
    for name in ("libopenblas.so.0", "libblas.so.3"):
        try:
            lib = ctypes.CDLL(name)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode()
        except (OSError, AttributeError):
            continue
    return "unknown"


def best_core():
    """The engine's choice for this CPU: SkylakeX with AVX-512 F/BW/VL, Haswell with AVX2 and FMA."""
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


def _option_from_argv(name):
    """The script's --name VALUE (or --name=VALUE), read before argparse runs; None if absent."""
    args = sys.argv[1:]
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _threads_from_argv():
    """The script's --threads N; else the thread count of the run in its --ours FILE (the
    scripts take theirs from it); else all cores."""
    threads = _option_from_argv("--threads")
    if threads and threads.isdigit():
        return int(threads)
    ours = _option_from_argv("--ours")
    if ours:
        try:
            with open(ours) as f:
                return int(json.load(f)["threads"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # the script itself reports a bad --ours file
    return os.cpu_count()


def use_best_blas():
    """Re-runs the script with the settings torch reads only when it loads:
    - OPENBLAS_CORETYPE, when OpenBLAS chose a generic core;
    - OPENBLAS_NUM_THREADS = the script's --threads, else the threads of its --ours run.
      Debian's torch does not tell OpenBLAS its thread count, so at --threads 1 its GEMMs
      still ran on every core, against our one;
    - OMP_WAIT_POLICY=PASSIVE. Torch runs its own loops on OpenMP threads and its GEMMs on
      OpenBLAS's pthreads; with OpenMP's default active waiting its idle threads spin on the
      cores the GEMM needs (measured here: ViT-Tiny training at 2 threads 24.5 samples/s active,
      57-63 passive).
    A user's own setting of any of them is respected."""
    if os.environ.get(_MARK):
        return
    changes = {}
    if not os.environ.get("OPENBLAS_NUM_THREADS"):
        changes["OPENBLAS_NUM_THREADS"] = str(_threads_from_argv())
    if not os.environ.get("OPENBLAS_CORETYPE"):
        core, wanted = openblas_core(), best_core()
        if core in GENERIC_CORES and wanted:
            changes["OPENBLAS_CORETYPE"] = wanted
    if not os.environ.get("OMP_WAIT_POLICY"):
        changes["OMP_WAIT_POLICY"] = "PASSIVE"
    if changes:
        env = dict(os.environ, **changes, **{_MARK: "1"})
        os.execve(sys.executable, [sys.executable] + sys.argv, env)


def onednn_kernels(torch):
    """The ISA oneDNN dispatches to and the kernel its convolution runs ("jit:avx512_core"), read
    from its verbose log of one small convolution (the log goes to file descriptor 1)."""
    if not torch.backends.mkldnn.is_available():
        return "off"
    with tempfile.TemporaryFile(mode="w+") as log:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(log.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                torch.nn.functional.conv2d(torch.randn(8, 64, 32, 32), torch.randn(64, 64, 3, 3), padding=1)
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        lines = log.read().splitlines()
    isa = next((l.split("isa:", 1)[1] for l in lines if ",isa:" in l), "unknown ISA")
    conv = next((l.split(",")[4] for l in lines if ",exec,cpu,convolution," in l), "no oneDNN convolution")
    return f"{isa}, convolution {conv}"


def describe(torch):
    """What the peer runs on: OpenBLAS's kernel family, ATen's vector ISA and oneDNN's kernels."""
    capability = "unknown"
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage:" in line:
            capability = line.split(":", 1)[1].strip()
    return {"blas": openblas_core(), "cpu_capability": capability, "onednn": onednn_kernels(torch),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default (active)"),
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "all cores")}


def fair(peer, ours_blas=None):
    """Whether ratios may be printed: the peer must not run generic kernels, and where ours is
    known, both sides must run the same family. Prints the reason when not."""
    if peer["blas"] in GENERIC_CORES:
        print(f"PEER MISCONFIGURED: PyTorch's OpenBLAS runs the generic {peer['blas']} kernels; no ratio is printed "
              f"(set OPENBLAS_CORETYPE={best_core()} or unset it to let this script choose)")
        return False
    if ours_blas and ours_blas != peer["blas"]:
        print(f"PEER MISMATCH: adjoint ran OpenBLAS {ours_blas} kernels, PyTorch runs {peer['blas']}; no ratio is printed")
        return False
    return True


def time_runs(repeats, fn, clock=time.perf_counter, warmup=1):
    """(median, fastest, slowest) seconds of `repeats` runs of fn after `warmup` untimed ones,
    as the engine's benchmarks time (tools/timing.h)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times), min(times), max(times)
