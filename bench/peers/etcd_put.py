#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""etcd put as the durable-write peer (etcd fsyncs its WAL before it
answers): p50/p99 of a 64-byte put from one client, then puts per second
from 1, 8 and 64 concurrent clients, against an etcd on 127.0.0.1:PORT.
The client is python3-etcd3 (gRPC), which adds its own overhead to etcd's
figures; repvar's are measured from C++.

Usage: etcd_put.py PORT OPS
"""
import sys
import threading
import time

import etcd3


def main(port, ops):
    c = etcd3.client(host="127.0.0.1", port=port)
    value = b"x" * 64
    for _ in range(20):
        c.put("warm", value)
    t = []
    for i in range(ops):
        t0 = time.perf_counter()
        c.put(f"k{i % 100}", value)
        t.append((time.perf_counter() - t0) * 1e6)
    t.sort()
    print(f"etcd test=PUT p50_us={t[len(t) // 2]:.1f} p99_us={t[int(len(t) * 0.99)]:.1f}")
    for clients in (1, 8, 64):
        each = max(20, ops // clients)
        conns = [etcd3.client(host="127.0.0.1", port=port) for _ in range(clients)]

        def run(k):
            for i in range(each):
                conns[k].put(f"c{k}/{i % 10}", value)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        rate = clients * each / (time.perf_counter() - t0)
        print(f"etcd_rate clients={clients} puts_per_s={rate:.0f}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
