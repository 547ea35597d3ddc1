#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks the layering of repvar's source tree against its CMake link graph.

CMake writes build/layers.json (cmake/RepvarTargets.cmake): every target of
ours with its sources and direct link dependencies. This script checks that

  1. every .h/.cc file of the tree belongs to exactly one target;
  2. a file includes only headers of its own target or of targets its target
     links, directly or transitively (no arrow points upward or sideways);
  3. no core target (and nothing a core target links) links gRPC, and no core
     file includes a gRPC header;
  4. the public headers (client/include, common/include) include only the
     standard library, Abseil and each other: no gRPC, protobuf or internal
     header;
  5. the cores the simulator runs (docs/simulator.md) wait, lock and start
     threads only through common/base/sync.h and read time only from a
     Clock: no absl mutex, condition variable or notification, no
     std::thread, no absl::Now or absl::SleepFor.

Usage: check_layers.py ROOT LAYERS_JSON    (exit 1 and a list of violations)
       check_layers.py --self-test          (shows that each rule catches a seeded violation)
"""

import json
import os
import re
import subprocess
import sys
import tempfile

CORE = {"repvar_types", "repvar_base", "repvar_tensor", "repvar_model",
        "repvar_server_core", "repvar_worker_core"}
PUBLIC_DIRS = ("client/include/", "common/include/")
SCANNED = ("common/", "server/", "worker/", "client/", "tests/", "bench/", "sim/")
UNSCANNED = ("bench/peers/",)
SIMULATED = {"repvar_server_core", "repvar_worker_core"}
UNSCHEDULED = re.compile(r"\b(absl::(Mutex|MutexLock|CondVar|Notification|SleepFor|Now)\b|std::thread\b)")
INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^">]+)[">]', re.M)


def load(root, layers_json):
    targets = {}
    for t in json.load(open(layers_json)):
        srcs = []
        for s in filter(None, t["sources"].split(";")):
            path = s if os.path.isabs(s) else os.path.join(t["dir"], s)
            rel = os.path.relpath(os.path.realpath(path), os.path.realpath(root))
            if not rel.startswith(".."):
                srcs.append(rel)
        links = []
        for l in filter(None, t["links"].split(";")):
            l = re.sub(r"^\$<LINK_ONLY:(.*)>$", r"\1", l)
            l = l.split("::@")[0]
            links.append(l)
        targets[t["name"]] = {"sources": srcs, "links": links}
    return targets


def closure(targets, name, seen=None):
    seen = set() if seen is None else seen
    for l in targets.get(name, {}).get("links", []):
        if l not in seen:
            seen.add(l)
            closure(targets, l, seen)
    return seen


def owner_of_generated(inc):
    if re.match(r"repvar/[\w/]+\.grpc\.pb\.h$", inc):
        return "repvar_grpc"
    if re.match(r"repvar/disk/[\w/]+\.pb\.h$", inc):
        return "repvar_disk_proto"
    if re.match(r"repvar/[\w/]+\.pb\.h$", inc):
        return "repvar_proto"
    return None


def check(root, targets, files):
    errors = []
    owner = {}
    for name, t in targets.items():
        for s in t["sources"]:
            if not s.endswith((".h", ".cc")):
                continue  # .proto files feed both repvar_proto and repvar_grpc
            if s in owner and owner[s] != name:
                errors.append(f"{s} belongs to two targets: {owner[s]} and {name}")
            owner[s] = name
    for f in files:
        if f.endswith((".h", ".cc")) and f.startswith(SCANNED) and not f.startswith(UNSCANNED):
            if f not in owner:
                errors.append(f"{f} belongs to no target (list it among a target's sources)")
    for f in sorted(owner):
        if not f.endswith((".h", ".cc")) or not os.path.exists(os.path.join(root, f)):
            continue
        me = owner[f]
        allowed = closure(targets, me) | {me}
        text = open(os.path.join(root, f), errors="replace").read()
        if me in SIMULATED:
            for n, line in enumerate(text.splitlines(), 1):
                code = line.split("//")[0]
                m = UNSCHEDULED.search(code)
                if m:
                    errors.append(f"{f}:{n}: {m.group(1)} in a simulated core: use "
                                  "common/base/sync.h (or the Clock) so the simulator schedules it")
        for kind, inc in INCLUDE.findall(text):
            if inc.startswith(("grpcpp/", "grpc/", "google/protobuf/")):
                if me in CORE:
                    errors.append(f"{f}: core target {me} includes the gRPC/protobuf header <{inc}>")
                if f.startswith(PUBLIC_DIRS):
                    errors.append(f"{f}: public header includes <{inc}>")
                continue
            if kind == "<":
                continue
            target = owner_of_generated(inc)
            if target is None:
                for base in ("", "common/include/", "client/include/"):
                    if os.path.exists(os.path.join(root, base, inc)):
                        target = owner.get(os.path.join(base, inc))
                        if target is None:
                            errors.append(f"{f}: includes {inc}, which belongs to no target")
                        break
            if target is None:
                continue  # not ours (a system header written with quotes)
            if f.startswith(PUBLIC_DIRS) and not inc.startswith("repvar/"):
                errors.append(f"{f}: public header includes the internal header {inc}")
            if target not in allowed:
                errors.append(f"{f} ({me}) includes {inc} of {target}, which {me} does not link")
    for name in CORE & set(targets):
        bad = [l for l in closure(targets, name) if l.startswith("gRPC::") or l == "repvar_grpc"]
        if bad:
            errors.append(f"core target {name} links gRPC ({', '.join(sorted(bad))})")
    return errors


def self_test():
    """Seeds one violation of each rule into a tiny tree and expects each reported."""
    with tempfile.TemporaryDirectory() as d:
        def write(path, text):
            os.makedirs(os.path.dirname(os.path.join(d, path)), exist_ok=True)
            open(os.path.join(d, path), "w").write(text)
        write("common/model/a.h", '#include "server/rpc/svc.h"\n')          # upward
        write("server/rpc/svc.h", "#include <grpcpp/grpcpp.h>\n")
        write("server/core/core.cc", "#include <grpcpp/grpcpp.h>\n"         # gRPC in core
              "absl::Mutex mu;  // absl::CondVar in a comment is fine\n")  # unscheduled wait
        write("server/core/orphan.h", "\n")                                  # no target
        write("client/include/repvar/client.h", '#include "common/model/a.h"\n')  # internal in public
        layers = [
            {"name": "repvar_model", "dir": d, "sources": "common/model/a.h", "links": ""},
            {"name": "repvar_server_core", "dir": d, "sources": "server/core/core.cc",
             "links": "repvar_model;gRPC::grpc++"},
            {"name": "repvar_server_rpc", "dir": d, "sources": "server/rpc/svc.h",
             "links": "repvar_server_core"},
            {"name": "repvar_client", "dir": d, "sources": "client/include/repvar/client.h",
             "links": "repvar_model"},
        ]
        write("layers.json", json.dumps(layers))
        files = ["common/model/a.h", "server/rpc/svc.h", "server/core/core.cc",
                 "server/core/orphan.h", "client/include/repvar/client.h"]
        errors = check(d, load(d, os.path.join(d, "layers.json")), files)
        expect = ["includes server/rpc/svc.h of repvar_server_rpc",
                  "core target repvar_server_core includes the gRPC/protobuf header",
                  "server/core/orphan.h belongs to no target",
                  "public header includes the internal header common/model/a.h",
                  "core target repvar_server_core links gRPC",
                  "server/core/core.cc:2: absl::Mutex in a simulated core"]
        missing = [e for e in expect if not any(e in x for x in errors)]
        if missing:
            print("self-test FAILED: not reported:", *missing, sep="\n  ")
            print("reported:", *errors, sep="\n  ")
            return 1
        print(f"self-test passed: {len(expect)} seeded violations reported")
        return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    root, layers_json = argv[1], argv[2]
    files = subprocess.check_output(["git", "-C", root, "ls-files"], text=True).split()
    files += subprocess.check_output(["git", "-C", root, "ls-files", "--others", "--exclude-standard"],
                                     text=True).split()
    errors = check(root, load(root, layers_json), sorted(set(files)))
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} layering violation(s)")
        return 1
    print("layering OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
