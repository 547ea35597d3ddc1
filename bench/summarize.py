#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Prints bench/run.sh's results: a table of the raw figures, then one line
per goal of bench/README.md ("Output format"):

    NAME ratio=X goal<=Y [baseline=Z]

X is repvar / peer (or the speed ratio where the goal says so, or value /
goal for absolute goals), measured in this run next to its peer. Lines
starting "baseline " in the results come from another build's repvar_bench
run in the same session (run.sh --baseline DIR); their ratio, against the
same peers, is printed as baseline=Z. A row this run cannot measure prints
ratio=nan and why.

Usage: summarize.py RESULTS_FILE
"""
import math
import re
import sys

kv = lambda line: dict(re.findall(r"(\w+)=([\w.\-]+)", line))


def number_or_word(v):
    try:
        return float(v)
    except ValueError:
        return v  # when=idle_14s


def parse(lines):
    out = {"mpi": {}, "gloo": {}, "tcp": {}, "disk": {}, "redis": {}, "etcd": {}, "floor": {},
           "netns": {}, "cur": {}, "base": {}, "curve": []}
    for line in lines:
        line = line.strip()
        who = "cur"
        if line.startswith("baseline "):
            who, line = "base", line[len("baseline "):]
        d = kv(line)
        if line.startswith("curve repvar_steps "):
            out["curve"].append({k: float(v) for k, v in d.items()})
            continue
        if line.startswith("mpi "):
            out["mpi"][(int(d["size"]), int(d["mib"]))] = float(d["bcast_ms"])
        elif line.startswith("gloo "):
            out["gloo"][(int(d["size"]), int(d["mib"]))] = (float(d["bcast_ms"]),
                                                             float(d["allreduce_ms"]))
        elif line.startswith("data_plane_bcast "):
            out["netns"][(d["algo"], int(d["size"]))] = (float(d["last_receiver_ms"]),
                                                         int(d["mib"]))
        elif line.startswith("netns_bcast "):
            out["netns"]["skipped"] = d.get("skipped", "")
        elif line.startswith("tcp "):
            out["tcp"][int(d["mib"])] = float(d["roundtrip_ms"])
        elif line.startswith("disk "):
            out["disk"][int(d["mib"])] = float(d["write_fsync_ms"])
        elif line.startswith("redis "):
            out["redis"][d["test"]] = float(d["p50_us"])
        elif line.startswith("etcd "):
            out["etcd"]["put_p50_us"] = float(d["p50_us"])
        elif line.startswith("grpc_step_floor "):
            out["floor"][int(d.get("changed", 0))] = {k: float(v) for k, v in d.items()}
        elif line.startswith("etcd_rate "):
            out["etcd"][("rate", int(d["clients"]))] = float(d["puts_per_s"])
        elif line.startswith("repvar_"):
            kind = line.split()[0]
            r = out[who].setdefault(kind, [])
            r.append({k: number_or_word(v) for k, v in d.items()})
    return out


def goals(res, who):
    """(name, ratio or None, comparison, goal, note) for one build's figures."""
    r = res[who]
    mpi, gloo, redis = res["mpi"], res["gloo"], res["redis"]
    rows = []

    def first(kind, **match):
        for x in r.get(kind, []):
            if all(x.get(k) == v for k, v in match.items()):
                return x
        return None

    b = first("repvar_bcast", workers=8, mib=256)
    m, g = mpi.get((8, 256)), gloo.get((8, 256), (None, None))[0]
    rows.append(("bcast_256m_8w_vs_mpi", b["assign_ms"] / m if b and m else None, "<=", 0.8,
                 (f"steady state; the first assign of the variable took {b['first_ms']:.0f} ms"
                  if "first_ms" in b else "") if b and m else
                 "no 256 MiB x 8 broadcast in this run"))
    rows.append(("bcast_256m_8w_vs_gloo", b["assign_ms"] / g if b and g else None, "<=", 1.15,
                 "gloo timed to its last receiver"))
    p2p = first("repvar_p2p")
    tcp = res["tcp"].get(int(p2p["mib"])) if p2p else None
    disk = res["disk"].get(int(p2p["mib"])) if p2p else None
    rows.append(("p2p_vs_tcp", tcp / p2p["total_ms"] if p2p and tcp else None, ">=", 0.7,
                 (f"speed; {p2p['mib']:.0f} MiB assigned to 1 replica (durable: "
                  f"{p2p['assign_ms']:.0f} ms; dd + fsync of the bytes {disk or math.nan:.0f}) and "
                  f"read back into a kept buffer ({p2p.get('read_into_ms', math.nan):.0f} ms; "
                  f"Read into a fresh vector {p2p['read_ms']:.0f}) vs TCP there and back {tcp:.0f} ms")
                 if p2p and tcp else "no point-to-point figure or TCP peer in this run"))
    etcd = res["etcd"].get("put_p50_us")
    du = first("repvar_durable")
    rows.append(("durable_write_vs_etcd", du["assign_p50_us"] / etcd if du and etcd else None, "<=",
                 0.6, "1 replica, fsync before the answer; etcd via python3-etcd3"))
    s = first("repvar_small")
    rows.append(("assign_add_8r_vs_etcd", s["assign_add_p50_us"] / etcd if s and etcd else None,
                 "<=", 0.6, "8 replicas, durable"))
    get = redis.get("GET")
    rows.append(("read_vs_redis", s["read_p50_us"] / get if s and get else None, "<=", 1.5, ""))
    local = s.get("local_read_p50_us") if s else None
    rows.append(("local_read_vs_redis", local / get if local and get else None, "<=", 0.5,
                 "a read of 16 floats from the worker's local read table (C8)"))
    bt = first("repvar_batch")
    # Each batch over one single-variable call of its own kind (bench/README.md:
    # "batch of 1,000 / one single call"); over a single create too, the
    # unit of the passes before the eleventh. An older bench (a --baseline
    # build) prints no single initialize or read: its ratio is nan rather
    # than one over another unit.
    for name, key, kind in (("batch_create_1000", "create1000_ms", "create"),
                            ("batch_init_1000", "initialize1000_ms", "initialize"),
                            ("batch_read_1000", "read1000_ms", "read")):
        unit = bt.get(f"single_{kind}_ms") if bt else None
        if not bt:
            rows.append((name, None, "<=", 20, ""))
        elif unit is None:
            rows.append((name, None, "<=", 20,
                         f"no single {kind} in this run (an older bench); over one single "
                         f"create: {bt[key] / bt['single_create_ms']:.1f}"))
        else:
            also = ("" if kind == "create" else
                    f"; over one single create: {bt[key] / bt['single_create_ms']:.1f}")
            if kind == "read" and "read1000_after_init_ms" in bt:
                # Both timed in a row; right after a write both are slower.
                after = bt["read1000_after_init_ms"] / bt["single_read_after_init_ms"]
                also += (f"; each right after its initialize: {bt['read1000_after_init_ms']:.2f} "
                         f"against {bt['single_read_after_init_ms']:.3f} ms, {after:.1f}")
            rows.append((name, bt[key] / unit, "<=", 20,
                         f"one single {kind} ({unit:.3f} ms) is the unit{also}"))
    loc = first("repvar_local")
    rows.append(("step_write_vs_memcpy", loc["memcpy_ms"] / loc["write_ms"] if loc else None, ">=",
                 0.7, "speed"))
    rows.append(("step_mapread_vs_memcpy",
                 loc["memcpy_ms"] / loc["mapped_read_ms"] if loc else None, ">=", 0.8, "speed"))
    st = first("repvar_steps", writes=0)
    fl = res["floor"].get(0)
    flc = res["floor"].get(1000)
    rows.append(("steps_per_s_32x1000", st["steps_per_s"] / 100 if st else None, ">=", 1,
                 (f"report path, {st['steps_per_s']:.1f}/s; its messages on bare gRPC, no "
                  f"repvar logic: {fl['steps_per_s']:.1f}/s" if fl else "report path")
                 if st else "not run"))
    rows.append(("steps_vs_grpc_floor",
                 st["steps_per_s"] / fl["steps_per_s"] if st and fl else None, ">=", 0.9,
                 "report path / its messages on bare gRPC (bench/peers/grpc_step_floor), "
                 "32 workers x 1,000 variables" if st and fl else "not run"))
    rows.append(("coordinator_cpu_32x1000",
                 st["coordinator_cpu_share"] / 0.5 if st else None, "<=", 1, ""))
    sw = first("repvar_steps", writes=1)
    rows.append(("steps_all_changed_vs_none",
                 sw["steps_per_s"] / st["steps_per_s"] if sw and st else None, ">=", 0.8,
                 (f"{sw['steps_per_s']:.2f} / {st['steps_per_s']:.1f} steps/s; coordinator CPU "
                  f"{sw['coordinator_cpu_ms_per_step']:.1f} / "
                  f"{st['coordinator_cpu_ms_per_step']:.1f} ms per step"
                  + (f"; the all-changed messages on bare gRPC: {flc['steps_per_s']:.1f} steps/s"
                     if flc else ""))
                 if sw and st else "not run (--step_write_path)"))
    mean = first("repvar_mean_step")
    ga = gloo.get((int(mean["workers"]), int(mean["mib"])), (None, None))[1] if mean else None
    rows.append(("mean_64m_8r_vs_gloo", mean["commit_ms"] / ga if mean and ga else None, "<=",
                 1.05,
                 (f"steady state; the first step took {mean['first_ms']:.0f} ms, the slowest of "
                  f"the pools' warm-up {mean['warming_max_ms']:.0f}")
                 if mean and "first_ms" in mean else ""))
    tt = first("repvar_torch")
    rows.append(("torch_step_vs_ddp", tt["repvar_step_ms"] / tt["ddp_step_ms"] if tt else None,
                 "<=", 1.2,
                 (f"{tt['params_mib']:.0f} MiB MLP, {tt['processes']:.0f} processes; "
                  f"sync overhead {tt['repvar_sync_ms']:.0f} vs DDP {tt['ddp_sync_ms']:.0f} ms"
                  + (f" (ratio {tt['repvar_sync_ms'] / tt['ddp_sync_ms']:.2f}, goal <= 1.2 too)"
                     if tt["ddp_sync_ms"] > 0 else " (DDP's within its local step's noise)")
                  if tt else "bench/torch_step.py not run")))
    rs = first("repvar_restart")
    rows.append(("restart_10k_1g", rs["serving_ms"] / 2000 if rs else None, "<=", 1,
                 "SIGKILL to a read answered; goal 2 s" if rs else "not run"))
    # repvar_bench --only_memory: 1 GiB held (4 x 256 MiB, 2 replicas on 2
    # workers), figures once the writes' buffers went back (idle 14 s).
    wr = [x for x in r.get("repvar_worker_rss", []) if x.get("when") == "idle_14s"]
    rows.append(("rss_worker_1g", max(x["rss_mib"] for x in wr) / (1.2 * 1024 + 64) if wr else None,
                 "<=", 1, "the larger of 2 workers, idle" if wr else "not run"))
    cr = first("repvar_coordinator_rss", when="idle_14s")
    rows.append(("rss_coordinator_1g", cr["rss_mib"] / 128 if cr else None, "<=", 1,
                 "idle; pages a read touches show as mapped page cache" if cr else "not run"))
    # The workers' data plane alone (bench/netns_bcast.sh), for this build only.
    ns = res["netns"] if who == "cur" else {}
    t2, t8 = ns.get(("chain", 2)), ns.get(("chain", 8))
    rows.append(("bcast_t8_t2_netns", t8[0] / t2[0] if t2 and t8 else None, "<=", 1.3,
                 (f"the workers' data plane, {t8[1]} MiB over 1 Gbit/s links (tc), "
                  f"{t8[0]:.0f} ms to the last of 8 against {t2[0]:.0f} ms to 1")
                 if t2 and t8 else
                 f"not measured here ({ns.get('skipped', 'bench/netns_bcast.sh not run')})"))
    return rows


def main(path):
    res = parse(open(path))
    print(f"{'broadcast':<22}{'repvar ms':>11}{'first ms':>10}{'MPI tcp ms':>12}{'gloo ms':>10}")
    for x in res["cur"].get("repvar_bcast", []):
        w, m = int(x["workers"]), int(x["mib"])
        print(f"{f'{m} MiB -> {w} workers':<22}{x['assign_ms']:>11.1f}"
              f"{x.get('first_ms', math.nan):>10.1f}"
              f"{res['mpi'].get((w, m), math.nan):>12.1f}"
              f"{res['gloo'].get((w, m), (math.nan,))[0]:>10.1f}")
    for kind in ("repvar_p2p", "repvar_small", "repvar_ephemeral", "repvar_durable",
                 "repvar_durable_rate", "repvar_restart", "repvar_coordinator_rss", "repvar_worker_rss", "repvar_batch",
                 "repvar_local", "repvar_mean_step", "repvar_steps"):
        for x in res["cur"].get(kind, []):
            print(kind, " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                 for k, v in x.items()))
    for key, rate in sorted((k, v) for k, v in res["etcd"].items() if isinstance(k, tuple)):
        print(f"etcd_rate clients={key[1]} puts_per_s={rate:g}")
    if res["curve"]:
        print()
        print("step cost curve (steps/s; coordinator CPU ms per step), every replica written"
              " / none written")
        for x in res["curve"]:
            print(f"  {int(x['workers']):>3} workers x {int(x['vars']):>6} variables "
                  f"{'all changed' if x['writes'] else 'none changed':>13}: "
                  f"{x['steps_per_s']:>8.2f} steps/s {x['coordinator_cpu_ms_per_step']:>7.2f} ms")
    print()
    cur = goals(res, "cur")
    base = goals(res, "base") if res["base"] else None
    for i, (name, ratio, cmp, goal, note) in enumerate(cur):
        line = f"{name} ratio={'nan' if ratio is None else f'{ratio:.3f}'} goal{cmp}{goal:g}"
        if base is not None:
            b = base[i][1]
            line += f" baseline={'nan' if b is None else f'{b:.3f}'}"
        if note:
            line += f"  # {note}"
        print(line)


if __name__ == "__main__":
    main(sys.argv[1])
