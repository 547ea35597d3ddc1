// SPDX-License-Identifier: Apache-2.0
// Peer: MIB bytes over one loopback TCP connection to another process and
// back (what an assign to one replica and its read back move), resident
// buffers on both sides, default socket options. Prints the median of ITERS
// round trips (after one to warm the connection and the pages) per size:
//   tcp_stream MIB[,MIB...] ITERS
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace {

void Check(bool ok, const char* what) {
  if (ok) return;
  std::perror(what);
  std::exit(1);
}

void SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, 0);
    Check(k > 0, "send");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void RecvAll(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, 0);
    Check(k > 0, "recv");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

// The other process: receives each buffer whole, then sends it back.
void Echo(int listener, const std::vector<size_t>& bytes, int rounds) {
  int fd = ::accept(listener, nullptr, nullptr);
  Check(fd >= 0, "accept");
  for (size_t n : bytes) {
    std::vector<char> buf(n, 0);
    for (int i = 0; i < rounds; ++i) {
      RecvAll(fd, buf.data(), n);
      SendAll(fd, buf.data(), n);
    }
  }
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  std::vector<size_t> mibs, bytes;
  std::stringstream ss(argv[1]);
  for (std::string s; std::getline(ss, s, ',');) mibs.push_back(std::stoul(s));
  for (size_t m : mibs) bytes.push_back(m << 20);
  const int iters = std::atoi(argv[2]);
  const int rounds = iters + 1;

  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  Check(listener >= 0, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  Check(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "bind");
  Check(::listen(listener, 1) == 0, "listen");
  socklen_t len = sizeof addr;
  Check(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0, "getsockname");

  pid_t child = ::fork();
  Check(child >= 0, "fork");
  if (child == 0) {
    Echo(listener, bytes, rounds);
    std::_Exit(0);
  }
  ::close(listener);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  Check(fd >= 0, "socket");
  Check(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "connect");
  for (size_t k = 0; k < bytes.size(); ++k) {
    const size_t n = bytes[k];
    std::vector<char> out(n, 1), back(n, 0);
    std::vector<double> ms;
    for (int i = 0; i < rounds; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      SendAll(fd, out.data(), n);
      RecvAll(fd, back.data(), n);
      auto t1 = std::chrono::steady_clock::now();
      if (i > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("tcp mib=%zu roundtrip_ms=%.2f\n", mibs[k], ms[ms.size() / 2]);
    std::fflush(stdout);
  }
  ::close(fd);
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
