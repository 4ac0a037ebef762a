#!/usr/bin/env python3
"""Where a decode step's GPU time goes, kernel by kernel, from Nsight Compute's CSV.

Reads the output of
    ncu --metrics gpu__time_duration.sum --csv --print-units base <program>
(each kernel timed alone, caches flushed), cuts it into steps at a marker kernel (the sampling
step's argmax by default: one per decode step), and prints for one step the kernels grouped by
name and grid: total microseconds, count, microseconds each. Programmatic dependent launch and
graph replay overlap kernel edges, so a step's sum exceeds its wall time; the table says where
the time is, not how long the step takes.

    python3 tools/kernel_breakdown.py ncu.csv [--marker argmax] [--step 1] [--top 30]
"""
import argparse
import collections
import csv
import io
import sys


def load(path, metric):
    """The kernels in launch order: (name, grid, microseconds)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line for line in f.read().splitlines() if line.startswith('"')]
    if not lines or not lines[0].startswith('"ID"'):
        sys.exit(f"{path}: no ncu CSV header (run ncu with --csv)")
    kernels = collections.OrderedDict()
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        if row["Metric Name"] != metric:
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row["Metric Unit"]
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit)
        if scale is None:
            sys.exit(f"{path}: unit '{unit}' of {metric} is not a time unit (ns, us, ms)")
        kernels[int(row["ID"])] = (row["Kernel Name"], row["Grid Size"], value * scale)
    if not kernels:
        sys.exit(f"{path}: no '{metric}' values")
    return list(kernels.values())


def short(name, width=70):
    """A kernel's name without its return type and parameter list, its tail kept (templates say
    the variant). Anonymous namespaces print as <unnamed> or (anonymous namespace)."""
    name = name.replace("(anonymous namespace)", "<unnamed>")
    if name.startswith("void "):
        name = name[5:]
    base = name.split("(")[0]
    return base if len(base) <= width else "..." + base[-(width - 3):]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu --csv output")
    ap.add_argument("--marker", default="argmax", help="a kernel name part that ends each step (default argmax)")
    ap.add_argument("--step", type=int, default=1,
                    help="which step: 0 is the kernels up to the first marker (the prefill), 1 the next, ... "
                         "(default 1; -1 the last complete one)")
    ap.add_argument("--top", type=int, default=30, help="rows printed (default 30)")
    ap.add_argument("--metric", default="gpu__time_duration.sum")
    args = ap.parse_args()

    kernels = load(args.csv, args.metric)
    ends = [i for i, k in enumerate(kernels) if args.marker in k[0]]
    if not ends:
        sys.exit(f"{args.csv}: no kernel named like '{args.marker}' ({len(kernels)} kernels read)")
    steps = [(0 if i == 0 else ends[i - 1] + 1, e + 1) for i, e in enumerate(ends)]
    index = args.step if args.step >= 0 else len(steps) + args.step
    if not 0 <= index < len(steps):
        sys.exit(f"--step {args.step}: the file holds {len(steps)} steps ending in '{args.marker}' (0 to {len(steps) - 1})")
    begin, end = steps[index]
    step = kernels[begin:end]
    groups = collections.OrderedDict()
    for name, grid, us in step:
        g = groups.setdefault((short(name), grid), [0, 0.0])
        g[0] += 1
        g[1] += us
    total = sum(us for _, _, us in step)
    print(f"step {index} of {len(steps)}: {len(step)} kernels, {total:.1f} us summed (each kernel alone)")
    print(f"{'us':>9} {'share':>6} {'count':>5} {'us each':>8}  kernel [grid]")
    for (name, grid), (count, us) in sorted(groups.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"{us:9.1f} {100 * us / total:5.1f}% {count:5d} {us / count:8.2f}  {name} {grid}")


if __name__ == "__main__":
    main()
