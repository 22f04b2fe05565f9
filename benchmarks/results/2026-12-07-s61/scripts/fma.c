#include <stdio.h>
#include <stdint.h>
#include <time.h>
static double now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
float w[64] __attribute__((aligned(64)));
/* 24 FMAs per iteration, reg-reg only */
static void pure(long n){
  __asm__ volatile(
    "vxorps %%zmm0,%%zmm0,%%zmm0\n" "vmovaps %%zmm0,%%zmm1\n" "vmovaps %%zmm0,%%zmm2\n" "vmovaps %%zmm0,%%zmm3\n"
    "vmovaps %%zmm0,%%zmm28\n" "vmovaps %%zmm0,%%zmm29\n"
    "1:\n"
    ".irp r,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27\n"
    "vfmadd231ps %%zmm28, %%zmm1, %%zmm\\r\n"
    ".endr\n"
    "dec %0\n" "jnz 1b\n" : "+r"(n) :: "memory");
}
/* 24 FMAs + 6 vbroadcastss from memory + 4 vector loads per iteration (the tile GEMM's k-step) */
static void tile(long n, float* p){
  __asm__ volatile(
    "1:\n"
    "vmovups (%1), %%zmm0\n" "vmovups 64(%1), %%zmm1\n" "vmovups 128(%1), %%zmm2\n" "vmovups 192(%1), %%zmm3\n"
    "vbroadcastss 0(%1), %%zmm28\n"
    "vfmadd231ps %%zmm28,%%zmm0,%%zmm4\n vfmadd231ps %%zmm28,%%zmm1,%%zmm5\n vfmadd231ps %%zmm28,%%zmm2,%%zmm6\n vfmadd231ps %%zmm28,%%zmm3,%%zmm7\n"
    "vbroadcastss 4(%1), %%zmm29\n"
    "vfmadd231ps %%zmm29,%%zmm0,%%zmm8\n vfmadd231ps %%zmm29,%%zmm1,%%zmm9\n vfmadd231ps %%zmm29,%%zmm2,%%zmm10\n vfmadd231ps %%zmm29,%%zmm3,%%zmm11\n"
    "vbroadcastss 8(%1), %%zmm30\n"
    "vfmadd231ps %%zmm30,%%zmm0,%%zmm12\n vfmadd231ps %%zmm30,%%zmm1,%%zmm13\n vfmadd231ps %%zmm30,%%zmm2,%%zmm14\n vfmadd231ps %%zmm30,%%zmm3,%%zmm15\n"
    "vbroadcastss 12(%1), %%zmm31\n"
    "vfmadd231ps %%zmm31,%%zmm0,%%zmm16\n vfmadd231ps %%zmm31,%%zmm1,%%zmm17\n vfmadd231ps %%zmm31,%%zmm2,%%zmm18\n vfmadd231ps %%zmm31,%%zmm3,%%zmm19\n"
    "vbroadcastss 16(%1), %%zmm28\n"
    "vfmadd231ps %%zmm28,%%zmm0,%%zmm20\n vfmadd231ps %%zmm28,%%zmm1,%%zmm21\n vfmadd231ps %%zmm28,%%zmm2,%%zmm22\n vfmadd231ps %%zmm28,%%zmm3,%%zmm23\n"
    "vbroadcastss 20(%1), %%zmm29\n"
    "vfmadd231ps %%zmm29,%%zmm0,%%zmm24\n vfmadd231ps %%zmm29,%%zmm1,%%zmm25\n vfmadd231ps %%zmm29,%%zmm2,%%zmm26\n vfmadd231ps %%zmm29,%%zmm3,%%zmm27\n"
    "dec %0\n" "jnz 1b\n" : "+r"(n) : "r"(p) : "memory");
}
/* the same with the broadcasts embedded in the FMAs ({1to16} memory operands) */
static void embedded(long n, float* p){
  __asm__ volatile(
    "1:\n"
    "vmovups (%1), %%zmm0\n" "vmovups 64(%1), %%zmm1\n" "vmovups 128(%1), %%zmm2\n" "vmovups 192(%1), %%zmm3\n"
    ".irp o,0,4,8,12,16,20\n"
    "vfmadd231ps \\o(%1)%{1to16%},%%zmm0,%%zmm4\n vfmadd231ps \\o(%1)%{1to16%},%%zmm1,%%zmm5\n vfmadd231ps \\o(%1)%{1to16%},%%zmm2,%%zmm6\n vfmadd231ps \\o(%1)%{1to16%},%%zmm3,%%zmm7\n"
    ".endr\n"
    "dec %0\n" "jnz 1b\n" : "+r"(n) : "r"(p) : "memory");
}
int main(){
  long n = 20000000;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = now(); pure(n); double t1 = now(); tile(n, w); double t2 = now(); embedded(n, w); double t3 = now();
    printf("ns per 24 FMAs: pure %.3f  tile(6 vbroadcastss) %.3f  embedded-broadcast %.3f\n", (t1-t0)/n*1e9, (t2-t1)/n*1e9, (t3-t2)/n*1e9);
  }
}
