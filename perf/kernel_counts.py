#!/usr/bin/env python3
"""The per-kernel table of perf/kernel_counts.sh (docs/cuda-emulation.md, "Kernel counts").

Reads the emulation's kernel counts (PDTRAIN_CUDA_EMU_PROFILE's kernel_counts.<pid>.tsv files),
each kernel's registers and static shared memory from the real nvcc build (ptxas -v logs), and
machine files; prints per kernel the counts, the bank-conflict and uncoalesced ratios, the
occupancy on sm_90 and a lower bound of its time on each machine.

  kernel_counts.py resources LOG...            -> TSV: kernel, registers, static_shared
  kernel_counts.py merge DIR                   -> TSV: the counts of DIR's files, summed
  kernel_counts.py step ONE TWO                -> TSV: TWO's counts less ONE's (one step)
  kernel_counts.py project F11 F21 F12 F22 S11 S21 S12 S22 S31 S13 S33 OUT L B
      -> OUT: the counts at L layers and micro-batch B from the full-shape runs F at (L, B),
         checked at the small shape's S (names the kernels that do not follow the form)
  kernel_counts.py same A B                    -> exit 1, naming the rows where A != B
  kernel_counts.py table COUNTS RESOURCES MACHINE... -> the table
  kernel_counts.py check COUNTS EXPECTED       -> exit 1 when a ratio rose above its record
  kernel_counts.py record COUNTS               -> the lines of an EXPECTED file for COUNTS
"""
import math
import re
import subprocess
import sys
import tomllib
from pathlib import Path

COUNT_FIELDS = ["launches", "threads", "shared_requests", "shared_wavefronts",
                "shared_ideal_wavefronts", "global_requests", "global_sectors",
                "global_ideal_sectors", "dram_bytes", "barriers", "tensor_flops"]

# ---------------------------------------------------------------------------------------------
# Counts: rows keyed by (kernel, block_threads, dynamic_shared).


def read_counts(path):
    rows = {}
    lines = Path(path).read_text().splitlines()
    header = lines[0].split("\t")
    for line in lines[1:]:
        f = dict(zip(header, line.split("\t")))
        key = (f["kernel"], int(f["block_threads"]), int(f["dynamic_shared"]))
        row = {k: int(f[k]) for k in COUNT_FIELDS}
        row["tensor_ops"] = {} if f["tensor_ops"] == "-" else {
            s.split("=")[0]: int(s.split("=")[1]) for s in f["tensor_ops"].split(",")}
        add_row(rows, key, row, 1)
    return rows


def add_row(rows, key, row, weight):
    to = rows.setdefault(key, {k: 0 for k in COUNT_FIELDS} | {"tensor_ops": {}})
    for k in COUNT_FIELDS:
        to[k] += weight * row[k]
    for shape, n in row["tensor_ops"].items():
        to["tensor_ops"][shape] = to["tensor_ops"].get(shape, 0) + weight * n


def write_counts(rows, out):
    out.write("kernel\tblock_threads\tdynamic_shared\t" + "\t".join(COUNT_FIELDS) + "\ttensor_ops\n")
    for key in sorted(rows):
        row = rows[key]
        if all(row[k] == 0 for k in COUNT_FIELDS):
            continue
        ops = ",".join(f"{s}={n}" for s, n in sorted(row["tensor_ops"].items()) if n != 0) or "-"
        out.write(f"{key[0]}\t{key[1]}\t{key[2]}\t" +
                  "\t".join(str(row[k]) for k in COUNT_FIELDS) + f"\t{ops}\n")


def merge(directory):
    rows = {}
    for path in sorted(Path(directory).glob("kernel_counts.*.tsv")):
        for key, row in read_counts(path).items():
            add_row(rows, key, row, 1)
    return rows


def combine(weighted):
    """sum of weight x counts over (rows, weight) pairs"""
    rows = {}
    for part, weight in weighted:
        for key, row in part.items():
            add_row(rows, key, row, weight)
    return rows


# ---------------------------------------------------------------------------------------------
# Resources from ptxas -v: registers and static shared memory per kernel (its base name: no
# namespace, template arguments or parameters; the largest over the instantiations, which is
# what the occupancy of any of them is at least as good as).


def base_name(name):
    name = name.replace("(anonymous namespace)", "").strip().strip("()").split("(")[0]
    depth, plain = 0, ""
    for ch in name:
        depth += ch == "<"
        if depth == 0:
            plain += ch
        depth -= ch == ">"
    return plain.split("::")[-1].split(" ")[-1].strip()


# Launch names (PDTRAIN_LAUNCH_AS) that are not their kernel function's name.
LAUNCH_ALIASES = {"to_bf16_kernel": "convert_kernel", "to_float_kernel": "convert_kernel"}


def function_of(launch_name):
    name = base_name(launch_name)
    return LAUNCH_ALIASES.get(name, name)


def resources(logs):
    entry = re.compile(r"Compiling entry function '([^']+)' for 'sm_90'")
    used = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")
    found, mangled = {}, None
    for log in logs:
        for line in Path(log).read_text().splitlines():
            if m := entry.search(line):
                mangled = m.group(1)
            elif (m := used.search(line)) and mangled:
                demangled = subprocess.run(["c++filt", mangled], capture_output=True,
                                           text=True, check=True).stdout.strip()
                name = base_name(demangled)
                regs, smem = int(m.group(1)), int(m.group(2) or 0)
                old = found.get(name, (0, 0))
                found[name] = (max(old[0], regs), max(old[1], smem))
                mangled = None
    return found


# ---------------------------------------------------------------------------------------------
# Occupancy on sm_90 (compute capability 9.0), as the CUDA Occupancy Calculator computes it:
# limits from the CUDA C++ Programming Guide's "Technical Specifications per Compute Capability"
# (65536 32-bit registers, 228 KiB shared memory and 2048 threads = 64 warps per SM, at most 32
# blocks per SM, 1 KiB of shared memory reserved per block); the allocation granularities of the
# calculator for 9.0 (registers per warp in units of 256, warps in groups of 4, shared memory in
# units of 128 bytes).
SM90 = dict(registers=65536, shared=228 * 1024, reserved_per_block=1024, warps=64, blocks=32,
            register_unit=256, warp_group=4, shared_unit=128)


def occupancy(block_threads, registers, shared_bytes):
    """(blocks per SM, occupancy in [0, 1], what limits it)"""
    a = SM90
    warps = math.ceil(block_threads / 32)
    limits = {"warps": a["warps"] // warps, "blocks": a["blocks"]}
    if registers > 0:
        per_warp = math.ceil(registers * 32 / a["register_unit"]) * a["register_unit"]
        warps_by_regs = (a["registers"] // per_warp) // a["warp_group"] * a["warp_group"]
        limits["registers"] = warps_by_regs // warps
    per_block = math.ceil((shared_bytes + a["reserved_per_block"]) / a["shared_unit"]) * a["shared_unit"]
    limits["shared"] = a["shared"] // per_block
    blocks = min(limits.values())
    limiter = min(limits, key=lambda k: (limits[k], k != "warps"))
    return blocks, blocks * warps / a["warps"], limiter


# ---------------------------------------------------------------------------------------------
# A lower bound of a kernel's time: the largest of its tensor-core FLOPs at the dense bf16 peak,
# its shared-memory wavefronts at one per SM per cycle, and its DRAM bytes at the memory
# bandwidth; a launch of fewer blocks than SMs has only that many SMs (and their share of the
# tensor peak).


def machine(path):
    t = tomllib.loads(Path(path).read_text())
    d = t["device"]
    missing = [k for k in ("sm_count", "sm_clock_mhz") if k not in d]
    if missing:
        sys.exit(f"kernel_counts: {path} has no device.{', device.'.join(missing)}")
    return dict(name=Path(path).stem, sms=d["sm_count"], clock=d["sm_clock_mhz"] * 1e6,
                bf16=d["peak_tflops_bf16"] * 1e12, bandwidth=d["memory_bandwidth_gbs"] * 1e9)


def time_bound(row, block_threads, m):
    """(seconds, what bounds it) for all the row's launches"""
    blocks_per_launch = row["threads"] / max(1, row["launches"]) / block_threads
    sms = min(m["sms"], max(1.0, blocks_per_launch))
    parts = {"tensor": row["tensor_flops"] / (m["bf16"] * sms / m["sms"]),
             "shared": row["shared_wavefronts"] / (sms * m["clock"]),
             "dram": row["dram_bytes"] / m["bandwidth"]}
    limiter = max(parts, key=parts.get)
    return parts[limiter], limiter


# ---------------------------------------------------------------------------------------------
# Scaling to the deck. A launch's counts are affine in the micro-batch size B, and every layer
# launches the same kernels on the same shapes, so each count of a kernel (by name) is bilinear:
#   count(L, B) = a + c B + y L + d L B
# (y: a layer's part independent of B, a bias's columns or the optimizer's parameters; d: its
# activations), fitted from the runs (L, B) = (1, 1), (2, 1), (1, 2), (2, 2). At the small shape
# three more runs, (3, 1), (1, 3), (3, 3), check it: exactly, but for DRAM bytes (the embedding
# gathers' follow the tokens: the largest deviation is reported) and the optimizer's kernels'
# linearity in L (their grids round up per parameter tensor: within 5 % at the small shape).
# A kernel whose counts do not follow it is named, and marked "?" in the table.

ZERO = {k: 0 for k in COUNT_FIELDS} | {"tensor_ops": {}}
STEP_TOLERANCE = 0.05
FIT_POINTS = [(1, 1), (2, 1), (1, 2), (2, 2)]
CHECK_POINTS = [(3, 1), (1, 3), (3, 3)]


def by_name(rows):
    out = {}
    for (name, _, _), row in rows.items():
        add_row(out, name.replace(" ", ""), row, 1)
    return out


def bilinear(v11, v21, v12, v22, layers, batch):
    d = (v22 - v12) - (v21 - v11)
    y = (v21 - v11) - d
    c = (v12 - v11) - d
    return v11 - c - y - d + c * batch + y * layers + d * layers * batch


def verify(fit, check):
    """the kernels (names) whose small-shape counts do not follow the form (printed)"""
    fit, check = [by_name(r) for r in fit], [by_name(r) for r in check]
    off, dram_dev = set(), 0.0
    for name in sorted(set().union(*fit, *check)):
        v = [r.get(name, ZERO) for r in fit]
        per_step = all(v[0][k] == v[2][k] for k in COUNT_FIELDS)
        for (layers, batch), run in zip(CHECK_POINTS, check):
            got = run.get(name, ZERO)
            for k in COUNT_FIELDS:
                want = bilinear(*(x[k] for x in v), layers, batch)
                dev = abs(got[k] - want) / max(1, abs(want))
                if k == "dram_bytes":
                    dram_dev = max(dram_dev, dev)
                elif dev > (STEP_TOLERANCE if per_step else 0):
                    print(f"kernel_counts: {name} {k} at (L, B) = ({layers}, {batch}): {got[k]}, "
                          f"the form says {want}")
                    off.add(name)
    print(f"kernel_counts: largest deviation of DRAM bytes from the form at the small shape: "
          f"{100 * dram_dev:.1f} %")
    return off


def project(fit, layers, batch, off):
    """the counts at `layers` layers and micro-batch size `batch`; kernels whose counts do not
    depend on B (the optimizer step's) named with a trailing ' *', those `off` the form with ' ?'"""
    rows = {}
    for key in set().union(*fit):
        v = [r.get(key, ZERO) for r in fit]
        row = {k: bilinear(*(x[k] for x in v), layers, batch) for k in COUNT_FIELDS}
        shapes = set().union(*(x["tensor_ops"] for x in v))
        row["tensor_ops"] = {s: bilinear(*(x["tensor_ops"].get(s, 0) for x in v), layers, batch)
                             for s in shapes}
        per_step = all(v[0][k] == v[2][k] for k in COUNT_FIELDS)
        mark = (" *" if per_step else "") + (" ?" if key[0].replace(" ", "") in off else "")
        rows[(key[0] + mark, key[1], key[2])] = row
    return rows


def ratio(a, b):
    return a / b if b else 0.0


def table(rows, res, machines, out):
    head = (f"{'kernel':<34} {'block':>5} {'dyn':>6} {'launch':>6} {'regs':>4} {'smem':>6} "
            f"{'occ%':>5} {'lim':<5} {'shr req':>10} {'wf/ideal':>8} {'glb req':>10} "
            f"{'sec/ideal':>9} {'DRAM MB':>9} {'TC GFLOP':>9} {'bars':>7}")
    for m in machines:
        head += f" {m['name'] + ' us':>14}"
    out.write(head + "\n")
    totals = {(m["name"], part): 0.0 for m in machines for part in ("", " *")}
    for key in sorted(rows, key=lambda k: (k[0], k[1], k[2])):
        name, block, dyn = key
        row = rows[key]
        regs, smem = res.get(function_of(name.removesuffix(" ?").removesuffix(" *")), (None, None))
        if regs is None:
            occ_text, regs_text, smem_text, lim = "?", "?", "?", "?"
        else:
            _, occ, lim = occupancy(block, regs, smem + dyn)
            occ_text, regs_text, smem_text = f"{100 * occ:.0f}", str(regs), str(smem)
        shown = name.replace("(", "").replace(")", "").replace(", ", ",")
        line = (f"{shown[:34]:<34} {block:>5} {dyn:>6} {row['launches']:>6} {regs_text:>4} "
                f"{smem_text:>6} {occ_text:>5} {lim[:5]:<5} {row['shared_requests']:>10} "
                f"{ratio(row['shared_wavefronts'], row['shared_ideal_wavefronts']):>8.2f} "
                f"{row['global_requests']:>10} "
                f"{ratio(row['global_sectors'], row['global_ideal_sectors']):>9.2f} "
                f"{row['dram_bytes'] / 1e6:>9.1f} {row['tensor_flops'] / 1e9:>9.2f} "
                f"{row['barriers']:>7}")
        for m in machines:
            seconds, limiter = time_bound(row, block, m)
            totals[(m["name"], " *" if name.removesuffix(" ?").endswith(" *") else "")] += seconds
            line += f" {seconds * 1e6:>9.1f} {limiter[:4]:<4}"
        out.write(line + "\n")
    for part, what in (("", "the kernels without *"), (" *", "the kernels with *")):
        out.write(f"lower bound of {what}: " + ", ".join(
            f"{m['name']} {totals[(m['name'], part)] * 1e3:.3f} ms" for m in machines) + "\n")


# ---------------------------------------------------------------------------------------------
# The regression check: a kernel's bank-conflict ratio (shared wavefronts / ideal wavefronts) or
# uncoalesced ratio (global sectors / ideal sectors) above what EXPECTED records for it fails.
# EXPECTED: lines "kernel  conflict_ratio  uncoalesced_ratio" (# comments); a kernel counted but
# not recorded fails too (record it), one recorded but not counted is reported.
TOLERANCE = 1e-3


def read_expected(path):
    expected = {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, conflict, uncoalesced = line.split()
            expected[name] = (float(conflict), float(uncoalesced))
    return expected


def kernel_ratios(rows):
    per_kernel = {}
    for (name, _, _), row in rows.items():
        add_row(per_kernel, name, row, 1)
    return {name.replace(" ", ""): (ratio(r["shared_wavefronts"], r["shared_ideal_wavefronts"]),
                   ratio(r["global_sectors"], r["global_ideal_sectors"]))
            for name, r in per_kernel.items()}


def check(rows, expected_path):
    expected, failures = read_expected(expected_path), []
    for name, (conflict, uncoalesced) in sorted(kernel_ratios(rows).items()):
        if name not in expected:
            failures.append(f"{name}: counted but not recorded in {expected_path} "
                            f"(conflict {conflict:.3f}, uncoalesced {uncoalesced:.3f})")
            continue
        rec = expected[name]
        for what, now, was in (("bank-conflict", conflict, rec[0]),
                               ("uncoalesced", uncoalesced, rec[1])):
            if now > was + TOLERANCE:
                failures.append(f"{name}: {what} ratio {now:.3f} above the recorded {was:.3f}")
    for name in sorted(set(expected) - set(kernel_ratios(rows))):
        print(f"kernel_counts: {name} is recorded but was not launched")
    for f in failures:
        print("kernel_counts: FAIL " + f)
    return not failures


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "resources":
        for name, (regs, smem) in sorted(resources(argv[2:]).items()):
            print(f"{name}\t{regs}\t{smem}")
    elif cmd == "merge":
        write_counts(merge(argv[2]), sys.stdout)
    elif cmd == "step":
        write_counts(combine([(read_counts(argv[3]), 1), (read_counts(argv[2]), -1)]), sys.stdout)
    elif cmd == "same":
        a, b = read_counts(argv[2]), read_counts(argv[3])
        differ = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        for k in differ:
            print(f"kernel_counts: {k[0]} (block {k[1]}, dynamic {k[2]}): {a.get(k)} != {b.get(k)}")
        return 1 if differ else 0
    elif cmd == "project":
        full = [read_counts(p) for p in argv[2:6]]
        small = [read_counts(p) for p in argv[6:13]]
        off = verify(small[:4], small[4:])
        with open(argv[13], "w") as out:
            write_counts(project(full, int(argv[14]), int(argv[15]), off), out)
    elif cmd == "table":
        res = {}
        for line in Path(argv[3]).read_text().splitlines():
            name, regs, smem = line.split("\t")
            res[name] = (int(regs), int(smem))
        table(read_counts(argv[2]), res, [machine(p) for p in argv[4:]], sys.stdout)
    elif cmd == "record":
        for name, (conflict, uncoalesced) in sorted(kernel_ratios(read_counts(argv[2])).items()):
            print(f"{name.replace(' ', '')}\t{conflict:.3f}\t{uncoalesced:.3f}")
    elif cmd == "check":
        return 0 if check(read_counts(argv[2]), argv[3]) else 1
    else:
        sys.exit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
