#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
/* one tile's depth loop as the tile GEMM runs it: per k 4 vector loads of X (row stride), 6 broadcasts
   of W (6 row streams), 24 FMAs, optionally 4 prefetcht0 of X PF rows ahead */
static void tile(long depth, const float* x, long xs, const float* w, long ws, int pf){
  long k;
  const float *w0=w, *w1=w+ws, *w2=w+2*ws, *w3=w+3*ws, *w4=w+4*ws, *w5=w+5*ws;
  __asm__ volatile("vxorps %%zmm4,%%zmm4,%%zmm4\n" ::: "memory");
  for (k = 0; k < depth; k++) {
    const float* xk = x + k * xs;
    if (pf) { __builtin_prefetch(xk + 4*xs, 0, 3); __builtin_prefetch(xk + 4*xs + 16, 0, 3); __builtin_prefetch(xk + 4*xs + 32, 0, 3); __builtin_prefetch(xk + 4*xs + 48, 0, 3); }
    __asm__ volatile(
      "vmovups (%0), %%zmm0\n vmovups 64(%0), %%zmm1\n vmovups 128(%0), %%zmm2\n vmovups 192(%0), %%zmm3\n"
      "vbroadcastss (%1), %%zmm28\n vfmadd231ps %%zmm28,%%zmm0,%%zmm4\n vfmadd231ps %%zmm28,%%zmm1,%%zmm5\n vfmadd231ps %%zmm28,%%zmm2,%%zmm6\n vfmadd231ps %%zmm28,%%zmm3,%%zmm7\n"
      "vbroadcastss (%2), %%zmm29\n vfmadd231ps %%zmm29,%%zmm0,%%zmm8\n vfmadd231ps %%zmm29,%%zmm1,%%zmm9\n vfmadd231ps %%zmm29,%%zmm2,%%zmm10\n vfmadd231ps %%zmm29,%%zmm3,%%zmm11\n"
      "vbroadcastss (%3), %%zmm30\n vfmadd231ps %%zmm30,%%zmm0,%%zmm12\n vfmadd231ps %%zmm30,%%zmm1,%%zmm13\n vfmadd231ps %%zmm30,%%zmm2,%%zmm14\n vfmadd231ps %%zmm30,%%zmm3,%%zmm15\n"
      "vbroadcastss (%4), %%zmm31\n vfmadd231ps %%zmm31,%%zmm0,%%zmm16\n vfmadd231ps %%zmm31,%%zmm1,%%zmm17\n vfmadd231ps %%zmm31,%%zmm2,%%zmm18\n vfmadd231ps %%zmm31,%%zmm3,%%zmm19\n"
      "vbroadcastss (%5), %%zmm28\n vfmadd231ps %%zmm28,%%zmm0,%%zmm20\n vfmadd231ps %%zmm28,%%zmm1,%%zmm21\n vfmadd231ps %%zmm28,%%zmm2,%%zmm22\n vfmadd231ps %%zmm28,%%zmm3,%%zmm23\n"
      "vbroadcastss (%6), %%zmm29\n vfmadd231ps %%zmm29,%%zmm0,%%zmm24\n vfmadd231ps %%zmm29,%%zmm1,%%zmm25\n vfmadd231ps %%zmm29,%%zmm2,%%zmm26\n vfmadd231ps %%zmm29,%%zmm3,%%zmm27\n"
      :: "r"(xk), "r"(w0+k), "r"(w1+k), "r"(w2+k), "r"(w3+k), "r"(w4+k), "r"(w5+k) : "memory");
  }
}
int main(int argc, char** argv){
  long depth = atol(argv[1]), positions = atol(argv[2]);   /* X [depth, positions], one tile of 64 columns at a time */
  long kernels = 96;
  float* x = aligned_alloc(64, depth * positions * 4); float* w = aligned_alloc(64, kernels * depth * 4);
  for (long i = 0; i < depth * positions; i++) x[i] = 1; for (long i = 0; i < kernels * depth; i++) w[i] = 1;
  for (int pf = 0; pf < 2; pf++) {
    double best = 1e9;
    for (int rep = 0; rep < 200; rep++) {
      double t0 = now();
      for (long r = 0; r < kernels; r += 6) for (long c = 0; c + 64 <= positions; c += 64) tile(depth, x + c, positions, w + r * depth, depth, pf);
      double t = now() - t0; if (t < best) best = t;
    }
    double macs = (double)kernels * depth * (positions / 64 * 64);
    printf("depth %ld positions %ld prefetch %d: %.1f GMAC/s (peak ~57.7)\n", depth, positions, pf, macs / best / 1e9);
  }
}
