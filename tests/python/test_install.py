# SPDX-License-Identifier: Apache-2.0
"""repvar installs like a library: `cmake --install` gives a prefix from
which a separate project builds the README's C++ examples
(examples/cpp/quickstart.cc, examples/cpp/step.cc) with find_package(repvar)
and, again, with pkg-config alone; they run against a live cluster. Every line
of the README's C++ and Python blocks is in those files (the Python one,
examples/python/quickstart.py, runs too). The installed headers name no gRPC
or protobuf type."""

import os
import re
import subprocess

import pytest

from conftest import BUILD

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
QUICKSTART = os.path.join(SOURCE, "examples/cpp/quickstart.cc")
STEP = os.path.join(SOURCE, "examples/cpp/step.cc")
PY_QUICKSTART = os.path.join(SOURCE, "examples/python/quickstart.py")


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    p = str(tmp_path_factory.mktemp("prefix"))
    subprocess.run(["cmake", "--install", BUILD, "--prefix", p], check=True,
                   capture_output=True)
    return p


def libdir(prefix):
    return next(os.path.dirname(os.path.join(d, f)) for d, _, fs in os.walk(prefix)
                for f in fs if f.startswith("librepvar_client.so"))


def run(binary, cluster):
    env = dict(os.environ, REPVAR_COORDINATOR_ADDRESS=cluster)
    out = subprocess.run([binary], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def readme_blocks(language):
    with open(os.path.join(SOURCE, "README.md")) as f:
        return re.findall(r"```%s\n(.*?)```" % re.escape(language), f.read(), re.S)


@pytest.mark.parametrize("language,files", [("c++", [QUICKSTART, STEP]),
                                            ("python", [PY_QUICKSTART])])
def test_readme_shows_the_examples_as_they_are_built(language, files):
    blocks = readme_blocks(language)
    assert len(blocks) >= 1
    programs = []
    for path in files:
        with open(path) as f:
            programs.append(f.read())
    for block in blocks:
        for line in block.splitlines():
            if line.strip() and line.strip() != "...":
                assert any(line in p for p in programs), \
                    f"README line in none of {files}: {line!r}"


def test_readme_python_example_runs(cluster):
    env = dict(os.environ, REPVAR_COORDINATOR_ADDRESS=cluster)
    for _ in range(2):  # a rerun finds the variable there and takes the next step
        out = subprocess.run(["/usr/bin/python3", PY_QUICKSTART], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert re.search(r"committed by 3 trainers", out.stdout), out.stdout


def test_installed_headers_carry_no_grpc_or_protobuf(prefix):
    headers = os.path.join(prefix, "include/repvar")
    names = sorted(os.listdir(headers))
    assert names == ["client.h", "step.h", "types.h"]
    for name in names:
        with open(os.path.join(headers, name)) as f:
            code = re.sub(r"//.*", "", f.read())  # what the compiler sees
        assert not re.search(r"grpc|protobuf|\.pb\.h", code, re.I), name
        for include in re.findall(r'#include [<"]([^>"]+)', code):
            assert include.startswith(("absl/", "repvar/")) or "/" not in include, include


def test_find_package_builds_the_quickstart_and_it_runs(prefix, cluster, tmp_path):
    build = str(tmp_path / "build")
    subprocess.run(["cmake", "-S", os.path.join(SOURCE, "examples/cpp"), "-B", build, "-G",
                    "Ninja", f"-DCMAKE_PREFIX_PATH={prefix}"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", build], check=True, capture_output=True)
    first = run(os.path.join(build, "quickstart"), cluster)
    # Read and ReadInto (into the program's own vector) give the same value.
    assert re.search(r"model/w: 6 replicas, version 2, w\[0\] = (\S+) "
                     r"\(read into: version 2, \1\)", first), first
    # Again: the variable exists and is initialized; the add makes version 3.
    assert "version 3," in run(os.path.join(build, "quickstart"), cluster)
    # A step with a trainer thread per TPU host: every replica ends the same.
    stepped = run(os.path.join(build, "step"), cluster)
    assert re.search(r"step \d+ committed by 3 trainers", stepped), stepped
    # A version the prefix does not have is refused.
    wants = tmp_path / "wants-9"
    wants.mkdir()
    (wants / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.25)\nproject(p LANGUAGES CXX)\n"
        "find_package(repvar 9.0 CONFIG REQUIRED)\n")
    bad = subprocess.run(["cmake", "-S", str(wants), "-B", str(tmp_path / "bad"),
                          f"-DCMAKE_PREFIX_PATH={prefix}"], capture_output=True, text=True)
    assert bad.returncode != 0 and "version" in bad.stderr, bad.stderr


def test_pkg_config_builds_the_quickstart_and_it_runs(prefix, cluster, tmp_path):
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(libdir(prefix), "pkgconfig"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "repvar"], env=env,
                           check=True, capture_output=True, text=True).stdout.split()
    binary = str(tmp_path / "quickstart")
    subprocess.run(["g++", QUICKSTART, "-o", binary, *flags, f"-Wl,-rpath,{libdir(prefix)}"],
                   check=True, capture_output=True)
    assert "model/w: 6 replicas" in run(binary, cluster)
