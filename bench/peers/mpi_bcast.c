/* SPDX-License-Identifier: Apache-2.0
 * Peer: MPI_Bcast of MIB-sized float buffers from rank 0; prints on rank 0 the
 * median over ITERS of the slowest rank's time per broadcast.
 *   mpirun -np N ./mpi_bcast MIB[,MIB...] ITERS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int iters = argc > 2 ? atoi(argv[2]) : 5;
  char* list = strdup(argc > 1 ? argv[1] : "1,64,256");
  for (char* tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    size_t bytes = (size_t)atoi(tok) << 20, cnt = bytes / sizeof(float);
    float* buf = malloc(bytes);
    for (size_t i = 0; i < cnt; i++) buf[i] = rank == 0 ? (float)i : -1.f;
    double* t = malloc(sizeof(double) * iters);
    MPI_Bcast(buf, (int)cnt, MPI_FLOAT, 0, MPI_COMM_WORLD); /* warm-up */
    for (int i = 0; i < iters; i++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Bcast(buf, (int)cnt, MPI_FLOAT, 0, MPI_COMM_WORLD);
      double dt = MPI_Wtime() - t0, mx;
      MPI_Reduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      t[i] = mx;
    }
    if (rank == 0) {
      qsort(t, iters, sizeof(double), cmp);
      printf("mpi size=%d mib=%s bcast_ms=%.2f\n", n, tok, t[iters / 2] * 1e3);
      fflush(stdout);
    }
    free(buf);
    free(t);
  }
  free(list);
  MPI_Finalize();
  return 0;
}
