# SPDX-License-Identifier: Apache-2.0
"""Builds the repvar package with its gRPC stubs: build_py runs protoc on
../proto/repvar/v1/*.proto (the grpc_python_plugin of Debian's
protobuf-compiler-grpc, which matches its python3-grpcio) into the build
tree, as repvar.v1.*_pb2 and *_pb2_grpc. Metadata: pyproject.toml."""

import glob
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.join(HERE, "..", "proto")
PLUGIN = os.environ.get("REPVAR_GRPC_PYTHON_PLUGIN", "/usr/bin/grpc_python_plugin")


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        protos = sorted(glob.glob(os.path.join(PROTO_ROOT, "repvar", "v1", "*.proto")))
        if not protos:
            raise RuntimeError(f"no .proto files under {PROTO_ROOT}: build from the source tree")
        protoc = shutil.which("protoc")
        if protoc is None or not os.path.exists(PLUGIN):
            raise RuntimeError("needs protoc and grpc_python_plugin "
                               "(apt install protobuf-compiler protobuf-compiler-grpc)")
        out = os.path.join(self.build_lib, "repvar", "v1")
        os.makedirs(out, exist_ok=True)
        open(os.path.join(out, "__init__.py"), "w").close()
        subprocess.run([protoc, f"-I{PROTO_ROOT}", f"--python_out={self.build_lib}",
                        f"--grpc_python_out={self.build_lib}",
                        f"--plugin=protoc-gen-grpc_python={PLUGIN}", *protos], check=True)


setup(cmdclass={"build_py": BuildPyWithStubs})
