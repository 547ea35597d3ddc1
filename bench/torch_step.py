#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch data-parallel step time through repvar.torch next to
DistributedDataParallel (gloo), the same model (examples/torch/train_mlp.py,
an MLP of tens of MiB), the same number of trainer processes, and the same
step unsynchronized (each process on its shard alone) to tell compute from
synchronization. Starts its own cluster: a coordinator (--data_dir: the
durable mode) and one worker with one accelerator per trainer, on 127.0.0.1.
Prints one line (medians over every trainer's steps after the first
--warmup, the same for every mode: steady state; repvar's first steps fill
the workers' buffer pools and the trainers' mappings of them, DDP's build
its buckets):

  repvar_torch processes=P params_mib=M batch=B local_step_ms=.. ddp_step_ms=..
      repvar_step_ms=.. ddp_sync_ms=.. repvar_sync_ms=.. repvar_sync_call_ms=..

where *_sync_ms = step - local step, repvar_sync_call_ms is the time in
ReplicatedModule.sync itself, and sync_{begin,write,commit,load}_ms its
phases. Usage:
  bench/torch_step.py BUILD_DIR [--processes 3] [--steps 10] [--warmup 4] [--hidden 8192]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def wait_port(path, proc, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path) as f:
                return int(f.read().strip())
        if proc.poll() is not None:
            raise SystemExit(f"a daemon exited early (see {path}.log)")
        time.sleep(0.02)
    raise SystemExit(f"no port in {path}")


def run_mode(build, args, mode, env):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = ["/usr/bin/python3", os.path.join(ROOT, "examples/torch/train_mlp.py"),
           f"--steps={args.steps}", f"--batch={args.batch}", "--lr=0.001", "--no_eval",
           f"--in_features={args.in_features}", f"--hidden={args.hidden}", f"--out={out}",
           f"--world={args.processes}", "--prefix=bench_mlp"] + (["--" + mode] if mode else [])
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    with open(out) as f:
        results = json.load(f)
    os.remove(out)
    w = args.warmup
    step = 1000 * np.median([s for r in results for s in r["step_seconds"][w:]])
    sync = [s for r in results for s in r.get("sync_seconds", [])[w:]]
    phases = {}
    for r in results:
        for p in r.get("sync_phases", [])[w:]:
            for k, v in p.items():
                if k != "local_loads":
                    phases.setdefault(k, []).append(v)
    return (step, 1000 * np.median(sync) if sync else None,
            {k: 1000 * np.median(v) for k, v in phases.items()}, results[0]["params_mib"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=4, help="steps not timed, every mode")
    ap.add_argument("--batch", type=int, default=24, help="global batch")
    ap.add_argument("--in_features", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=8192)
    args = ap.parse_args()
    if args.steps <= args.warmup:
        raise SystemExit("--steps must be more than --warmup")
    build = os.path.abspath(args.build)
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"))
    local, _, _, mib = run_mode(build, args, "local", env)
    ddp, _, _, _ = run_mode(build, args, "ddp", env)
    with tempfile.TemporaryDirectory(prefix="repvar-torch-bench-") as d:
        procs = []
        try:
            coord = subprocess.Popen(
                [os.path.join(build, "server/repvar-coordinator"), f"--data_dir={d}/data",
                 f"--expected_tasks=tpu_worker:{args.processes}", f"--port_file={d}/c.port",
                 "--exit_with_parent"],
                stdout=subprocess.DEVNULL, stderr=open(f"{d}/c.port.log", "w"))
            procs.append(coord)
            address = f"127.0.0.1:{wait_port(f'{d}/c.port', coord)}"
            for t in range(args.processes):
                procs.append(subprocess.Popen(
                    [os.path.join(build, "worker/repvar-worker"), "--job=tpu_worker",
                     f"--task={t}", "--tpu_devices=1", f"--coordinator_address={address}",
                     "--exit_with_parent"],
                    stdout=subprocess.DEVNULL, stderr=open(f"{d}/w{t}.log", "w")))
            repvar, sync_call, phases, _ = run_mode(
                build, args, "", dict(env, REPVAR_COORDINATOR_ADDRESS=address))
        finally:
            for p in reversed(procs):
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=30)
    print(f"repvar_torch processes={args.processes} params_mib={mib:.2f} batch={args.batch} "
          f"local_step_ms={local:.1f} ddp_step_ms={ddp:.1f} repvar_step_ms={repvar:.1f} "
          f"ddp_sync_ms={ddp - local:.1f} repvar_sync_ms={repvar - local:.1f} "
          f"repvar_sync_call_ms={sync_call:.1f} "
          + " ".join(f"sync_{k}_ms={v:.1f}" for k, v in phases.items()))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
