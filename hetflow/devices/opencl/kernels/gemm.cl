// Tiled, register-blocked GEMM with a fused epilogue:
//   Y[z] = act(alpha * op(A[z]) @ op(B[z]) + beta * C)
//
// Both operands come packed in zero-padded *panels*: A as [Mp / AW][Kp][AW] and B as [Np / BW][Kp][BW],
// so that Mp, Np and Kp are multiples of the tile sizes and the main loop has no bounds checks. With
// LOCAL=0 the panels are one work-item's rows and columns (AW = RM, BW = RN * VW), read as sequential
// streams; with LOCAL=1 a single panel each (AW = Mp, BW = Np), i.e. At (Kp x Mp) and B (Kp x Np), from
// which work-groups stage tiles in local memory. Only the epilogue checks bounds; it writes the exact
// M x N result. Producers on the device (im2col, Winograd's input transform, the LSTM cell) write their
// output straight into this layout.
//
// Batches: matrix z reads A panel set (z % a_mod), B panel set (z % b_mod) and bias rows (z % c_mod), so
// one launch covers shared weights (a_mod = 1), grouped convolutions (a_mod = c_mod = groups) and plain
// batched products (mods = batch).
//
// Compile-time knobs (-D), searched by the tuner:
//   RM     rows per work-item            RN   vectors per work-item along N
//   VW     vector width (1, 2, 4, 8, 16) KT   K tile (local-memory depth, unroll depth)
//   WGM    work-group rows               WGN  work-group columns
//   LOCAL  1: stage tiles in local memory, 0: read packed global memory directly
//   MB     with LOCAL=0: 0, each work-item computes one RM x (RN * VW) block over all of K; MB > 0,
//          each work-item walks MB row blocks per KC-deep slice of K, keeping its B micro-panel slice
//          (KC x RN * VW floats) in L1 while the A panels stream past (partial sums wait in Y)
//   KC     K slice of the MB > 0 walk
//   ACT    0 none, 1 Relu, 2 LeakyRelu(act_a), 3 Clip(act_a, act_b), 4 Sigmoid, 5 Tanh
// Each work-item computes an RM x (RN * VW) block of Y in registers.

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

#if VW == 1
typedef float vec_t;
#define VLOAD_G(p) (*(p))
#define VLOAD_L(p) (*(p))
#define VSTORE(v, p) (*(p) = (v))
#else
typedef CAT(float, VW) vec_t;
// NOTE: plain vector dereferences rather than vloadN/vstoreN: PoCL calls those builtins out of line,
// which cost 2x; every offset used here is a multiple of VW floats, so the accesses are aligned.
#define VLOAD_G(p) (*(__global const vec_t*)(p))
#define VLOAD_L(p) (*(__local const vec_t*)(p))
#define VSTORE(v, p) (*(vec_t*)(p) = (v))
#endif

#ifndef MB
#define MB 0
#endif
#ifndef KC
#define KC 256
#endif

#define TILE_M (WGM * RM)
#define TILE_N (WGN * RN * VW)

// activate(x, act_a, act_b): the fused activation, from epilogue.cl (built in front of this file).

__kernel __attribute__((reqd_work_group_size(WGN, WGM, 1)))
void gemm(const int M, const int N, const int Kp, const int Mp, const int Np,
          __global const float* restrict At, const long at_batch, const int a_mod,
          __global const float* restrict B, const long b_batch, const int b_mod,
          __global float* restrict Y,
          __global const float* restrict C, const int c_sm, const int c_sn, const long c_batch,
          const int c_mod, const int has_c,
          const float alpha, const float beta, const float act_a, const float act_b)
{
    const int z = get_global_id(2);
    At += (z % a_mod) * at_batch;
    B += (z % b_mod) * b_batch;
    C += (z % c_mod) * c_batch;
    Y += (long)z * M * N;

    vec_t acc[RM][RN];
    #pragma unroll
    for (int r = 0; r < RM; ++r)
        #pragma unroll
        for (int c = 0; c < RN; ++c)
            acc[r][c] = (vec_t)(0.0f);

#if LOCAL
    __local float la[KT * TILE_M] __attribute__((aligned(64)));
    __local float lb[KT * TILE_N] __attribute__((aligned(64)));
    const int lm = get_local_id(1);
    const int ln = get_local_id(0);
    const int lid = lm * WGN + ln;
    const int tile_row = get_group_id(1) * TILE_M;
    const int tile_col = get_group_id(0) * TILE_N;
    for (int k0 = 0; k0 < Kp; k0 += KT) {
        for (int i = lid; i < KT * TILE_M; i += WGM * WGN)
            la[i] = At[(k0 + i / TILE_M) * Mp + tile_row + i % TILE_M];
        for (int i = lid; i < KT * TILE_N; i += WGM * WGN)
            lb[i] = B[(k0 + i / TILE_N) * Np + tile_col + i % TILE_N];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < KT; ++kk) {
            vec_t b[RN];
            #pragma unroll
            for (int c = 0; c < RN; ++c)
                b[c] = VLOAD_L(lb + kk * TILE_N + (ln * RN + c) * VW);
            #pragma unroll
            for (int r = 0; r < RM; ++r) {
                const vec_t a = (vec_t)(la[kk * TILE_M + lm * RM + r]);
                #pragma unroll
                for (int c = 0; c < RN; ++c)
                    acc[r][c] += a * b[c];
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const int row0 = tile_row + lm * RM;
    const int col0 = tile_col + ln * RN * VW;
#elif MB > 0
    const int col0 = get_global_id(0) * RN * VW;
    __global const float* b_panel = B + (long)get_global_id(0) * Kp * RN * VW;
    const int rb0 = get_global_id(1) * MB;
    const int rb1 = min(rb0 + MB, Mp / RM);
    for (int k0 = 0; k0 < Kp; k0 += KC) {
        const int k1 = min(k0 + KC, Kp);
        for (int rb = rb0; rb < rb1; ++rb) {
            __global const float* a_panel = At + (long)rb * Kp * RM;
            #pragma unroll
            for (int r = 0; r < RM; ++r)
                #pragma unroll
                for (int c = 0; c < RN; ++c)
                    acc[r][c] = (vec_t)(0.0f);
#pragma unroll 4
            for (int k = k0; k < k1; ++k) {
                vec_t b[RN];
                #pragma unroll
                for (int c = 0; c < RN; ++c)
                    b[c] = VLOAD_G(b_panel + (k * RN + c) * VW);
                #pragma unroll
                for (int r = 0; r < RM; ++r) {
                    const vec_t a = (vec_t)(a_panel[k * RM + r]);
                    #pragma unroll
                    for (int c = 0; c < RN; ++c)
                        acc[r][c] += a * b[c];
                }
            }
            // Partial sums of earlier slices wait in Y; the last slice applies the epilogue.
            #pragma unroll
            for (int r = 0; r < RM; ++r) {
                const int i = rb * RM + r;
                if (i >= M)
                    break;
                #pragma unroll
                for (int c = 0; c < RN; ++c) {
                    float out[VW] __attribute__((aligned(64)));
                    VSTORE(acc[r][c], out);
                    #pragma unroll
                    for (int v = 0; v < VW; ++v) {
                        const int j = col0 + c * VW + v;
                        if (j >= N)
                            break;
                        float s = out[v];
                        if (k0 > 0)
                            s += Y[i * N + j];
                        if (k1 == Kp) {
                            s *= alpha;
                            if (has_c)
                                s += beta * C[i * c_sm + j * c_sn];
                            s = activate(s, act_a, act_b);
                        }
                        Y[i * N + j] = s;
                    }
                }
            }
        }
    }
    return;
#else
    const int row0 = get_global_id(1) * RM;
    const int col0 = get_global_id(0) * RN * VW;
    // Panel layout: this work-item's RM rows of At and RN * VW columns of B are contiguous, one
    // k-slice after the other, so both streams are read sequentially.
    __global const float* a_panel = At + (long)get_global_id(1) * Kp * RM;
    __global const float* b_panel = B + (long)get_global_id(0) * Kp * RN * VW;
#pragma unroll 4
    for (int k = 0; k < Kp; ++k) {
        vec_t b[RN];
        #pragma unroll
        for (int c = 0; c < RN; ++c)
            b[c] = VLOAD_G(b_panel + (k * RN + c) * VW);
        #pragma unroll
        for (int r = 0; r < RM; ++r) {
            const vec_t a = (vec_t)(a_panel[k * RM + r]);
            #pragma unroll
            for (int c = 0; c < RN; ++c)
                acc[r][c] += a * b[c];
        }
    }
#endif

#if LOCAL || MB == 0
    #pragma unroll
    for (int r = 0; r < RM; ++r) {
        const int i = row0 + r;
        if (i >= M)
            break;
        #pragma unroll
        for (int c = 0; c < RN; ++c) {
            float out[VW] __attribute__((aligned(64)));
            VSTORE(acc[r][c], out);
            #pragma unroll
            for (int v = 0; v < VW; ++v) {
                const int j = col0 + c * VW + v;
                if (j >= N)
                    break;
                float y = alpha * out[v];
                if (has_c)
                    y += beta * C[i * c_sm + j * c_sn];
                Y[i * N + j] = activate(y, act_a, act_b);
            }
        }
    }
#endif
}
