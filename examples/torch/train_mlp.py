#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Data-parallel training of a small MLP with repvar.torch: one trainer
process per accelerator host, each taking its shard of every global batch;
each step is a replicated step whose MEAN aggregation leaves every replica
(and every trainer's module) identical. Run on a cluster
(deploy/local-cluster.sh prints how):

    REPVAR_COORDINATOR_ADDRESS=... PYTHONPATH=build/python \\
        /usr/bin/python3 examples/torch/train_mlp.py --steps 100

--ddp trains the same model the same way under torch.nn.parallel.
DistributedDataParallel (gloo) instead, for comparison; --local trains each
shard alone, unsynchronized (the step without its synchronization, which
bench/torch_step.py subtracts). --out FILE writes what each trainer ended
with (losses, parameters, step times) as JSON. --in_features and --hidden
size the model (bench/torch_step.py uses one of tens of MiB).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import torch

IN, HIDDEN, OUT = 16, 64, 1


def params_mib() -> float:
    return 4 * (IN * HIDDEN + HIDDEN + HIDDEN * OUT + OUT) / (1 << 20)


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, OUT))


def dataset(seed: int = 7, n: int = 4096):
    """A synthetic regression task: y = tanh(x . w) + noise."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, IN)).astype(np.float32)
    w = rng.standard_normal((IN, 1)).astype(np.float32)
    y = (np.tanh(x @ w) + 0.05 * rng.standard_normal((n, 1))).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(y)


def global_batch(k: int, batch: int, x, y):
    """Global batch k (0-based), cycling through the data."""
    start = (k * batch) % (x.shape[0] - batch + 1)
    return x[start:start + batch], y[start:start + batch]


def shard(xb, yb, rank: int, world: int):
    per = xb.shape[0] // world
    return xb[rank * per:(rank + 1) * per], yb[rank * per:(rank + 1) * per]


def full_loss(model, x, y) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), y))


def single_process(steps: int, batch: int, lr: float):
    """The reference: one process, SGD on each whole global batch."""
    x, y = dataset()
    model = make_model(seed=1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for k in range(steps):
        xb, yb = global_batch(k, batch, x, y)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
        losses.append(full_loss(model, x, y))
    return model, losses


def trainer(args) -> dict:
    """One trainer: its host's worker is args.worker; rank 0 is the chief."""
    x, y = dataset()
    # Every trainer builds the model; only the chief's initial values count.
    model = make_model(seed=1 + args.rank)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    losses, step_seconds, sync_seconds, phases = [], [], [], []

    def evaluate(k):
        if not args.no_eval or k == args.steps - 1:
            losses.append(full_loss(model, x, y))

    if args.local:
        for k in range(args.steps):
            t0 = time.perf_counter()
            xb, yb = shard(*global_batch(k, args.batch, x, y), args.rank, args.world)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
            step_seconds.append(time.perf_counter() - t0)
            evaluate(k)
    elif args.ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.ddp_port}",
                                rank=args.rank, world_size=args.world)
        for p in model.parameters():  # the chief's initial values, as repvar does
            dist.broadcast(p.data, src=0)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        for k in range(args.steps):
            t0 = time.perf_counter()
            xb, yb = shard(*global_batch(k, args.batch, x, y), args.rank, args.world)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(xb), yb).backward()  # gradients averaged
            opt.step()
            step_seconds.append(time.perf_counter() - t0)
            evaluate(k)
        dist.destroy_process_group()
    else:
        import repvar
        import repvar.torch
        client = repvar.connect()
        rm = repvar.torch.ReplicatedModule(client, model, args.prefix, worker=args.worker,
                                           is_chief=args.rank == 0)
        for k in range(args.steps):
            t0 = time.perf_counter()
            xb, yb = shard(*global_batch(k, args.batch, x, y), args.rank, args.world)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()  # this trainer's local update...
            t1 = time.perf_counter()
            rm.sync(args.base_step + k + 1)  # ...and the MEAN of everyone's, everywhere
            step_seconds.append(time.perf_counter() - t0)
            sync_seconds.append(time.perf_counter() - t1)
            phases.append(dict(rm.last_phases, local_loads=len(rm.last_local_loads)))
            evaluate(k)
            if not args.no_eval:
                # The coordinator's web view draws it (the mean of what trainers publish).
                client.publish_scalar(f"{args.prefix}/loss", args.base_step + k + 1, losses[-1])
        client.close()
    return {"rank": args.rank, "losses": losses, "step_seconds": step_seconds,
            "sync_seconds": sync_seconds, "sync_phases": phases, "params_mib": params_mib(),
            # (not for --no_eval runs: a model of tens of MiB as JSON takes minutes)
            "params": {} if args.no_eval else {n: p.detach().numpy().tolist()
                                               for n, p in model.named_parameters()}}


def launch(args) -> list:
    """Starts one trainer per accelerator host and waits for them."""
    if args.ddp or args.local:
        if args.ddp:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                args.ddp_port = s.getsockname()[1]
        workers = [f"ddp:{r}" for r in range(args.world or 2)]
        base = 0
    else:
        import repvar
        with repvar.connect() as c:
            c.wait_for_topology(60)
            topo = c.topology()
            hosts = sorted({(a.job, a.task) for a in topo.accelerators})
            workers = [f"{job}:{task}" for job, task in hosts]
            base = c.last_committed_step()
    world = len(workers)
    procs, outs = [], []
    for rank, worker in enumerate(workers):
        out = f"{args.out or '/tmp/repvar-train-mlp'}.{rank}.json"
        outs.append(out)
        cmd = [sys.executable, __file__, "--role=trainer", f"--rank={rank}", f"--world={world}",
               f"--worker={worker}", f"--base_step={base}", f"--steps={args.steps}",
               f"--batch={args.batch}", f"--lr={args.lr}", f"--prefix={args.prefix}",
               f"--in_features={args.in_features}", f"--hidden={args.hidden}",
               f"--result={out}"] + ([f"--ddp", f"--ddp_port={args.ddp_port}"] if args.ddp else [])
        cmd += (["--local"] if args.local else []) + (["--no_eval"] if args.no_eval else [])
        procs.append(subprocess.Popen(cmd))
    rcs = [p.wait(timeout=600) for p in procs]
    if any(rcs):
        raise SystemExit(f"a trainer failed: exit codes {rcs}")
    results = []
    for out in outs:
        with open(out) as f:
            results.append(json.load(f))
        os.remove(out)
    return results


def main():
    global IN, HIDDEN
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=192, help="global batch (split across trainers)")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--prefix", default="mlp")
    ap.add_argument("--ddp", action="store_true", help="DistributedDataParallel (gloo) instead")
    ap.add_argument("--local", action="store_true",
                    help="each trainer on its shard alone, unsynchronized (a baseline)")
    ap.add_argument("--in_features", type=int, default=IN)
    ap.add_argument("--hidden", type=int, default=HIDDEN)
    ap.add_argument("--no_eval", action="store_true",
                    help="the loss over the whole dataset only after the last step")
    ap.add_argument("--out", help="write every trainer's result as JSON here")
    # A trainer process (started by the launcher):
    ap.add_argument("--role", default="launcher", choices=["launcher", "trainer"])
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=0)
    ap.add_argument("--worker", default="")
    ap.add_argument("--base_step", type=int, default=0)
    ap.add_argument("--ddp_port", type=int, default=0)
    ap.add_argument("--result", default="")
    args = ap.parse_args()
    IN, HIDDEN = args.in_features, args.hidden
    torch.set_num_threads(1)
    if args.role == "trainer":
        with open(args.result, "w") as f:
            json.dump(trainer(args), f)
        return
    results = launch(args)
    losses = results[0]["losses"]
    what = ("DistributedDataParallel (gloo)" if args.ddp else
            "unsynchronized" if args.local else "repvar.torch")
    print(f"{what}: {len(results)} trainers, {args.steps} steps of a global batch of {args.batch}"
          f" ({params_mib():.2f} MiB of parameters)")
    if args.no_eval:
        print(f"  step {args.steps:4d}  loss {losses[-1]:.5f}")
    else:
        for k in sorted({0, len(losses) // 4, len(losses) // 2, 3 * len(losses) // 4,
                         len(losses) - 1}):
            print(f"  step {k + 1:4d}  loss {losses[k]:.5f}")
    # The first step warms up (connections, allocations); medians of the rest.
    ms = 1000 * np.median([s for r in results for s in r["step_seconds"][1:] or r["step_seconds"]])
    print(f"  median step time {ms:.1f} ms")
    sync = [s for r in results for s in r.get("sync_seconds", [])[1:]]
    if sync:
        print(f"  median sync time {1000 * np.median(sync):.1f} ms")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
