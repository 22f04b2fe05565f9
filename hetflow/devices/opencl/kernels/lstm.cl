// LSTM time steps. xw [seq * batch, 4H] = X @ W^T + Wb + Rb holds every step's input projection (one GEMM
// before the loop). Gates are stacked i, o, f, c (ONNX's order); peepholes P = [P_i, P_o, P_f]; clip
// bounds every pre-activation; the activations are ONNX's defaults (Sigmoid, Tanh, Tanh). The new cell
// state overwrites c in place (one work-item owns each element); the new hidden state goes to Y (at its
// step and direction), to h_out (the final Y_h) and to h_next, the state the next step reads. With
// sequence lengths, steps past an element's length carry its state over, and the reverse direction runs
// backward within each element's own length (as the CPU kernel and ONNX Runtime do).
//
// Two ways to run a step:
//
// lstm_cell, after the recurrent GEMM gates [batch, 4H] = H_prev @ R^T (the tiled GEMM, for larger
// batches): the cell update only, h_prev / h_next in the GEMM's A-panel layout (padding entries are never
// written: they stay zero). Global size (H, batch).
//
// lstm_step, the fused step for small batches: the gates product and the cell in one launch. Build
// options: LSTM_BATCH (the batch), LSTM_UNITS (J), LSTM_LANES (T, a power of two), LSTM_VEC (V: 1, 4, 8
// or 16). R comes as ONNX stores it, [4H, H] row-major (each gate row contiguous over K), and h_prev /
// h_next as plain [batch, H] buffers; both rows are padded with zeros to kp floats, a multiple of T * V.
// Work split: a work-group owns J hidden units and all four gate rows of each, for every batch element;
// T work-items share a unit and stride over K in vectors of V (vector k = lane + T * n), so consecutive
// work-items read consecutive weights. Each keeps 4 * batch vector accumulators in registers (the h_prev
// vector it loads serves all four gates). With T > 1, the T partial sums of each (gate, element) are
// tree-reduced in local memory and lane b of the unit finishes element b; with T = 1 (CPUs) the work-item
// owns whole sums and finishes every element itself, with no local memory or barrier. Local size J * T,
// global size ceil(H / J) * J * T. h_prev is read from global memory, not staged in local memory: every
// group reads all of it, it stays in cache, and staging would bound H by the local memory size.

inline float sigmoid(const float x) { return 1.0f / (1.0f + exp(-x)); }

inline float bound(const float x, const int has_clip, const float clip) {
    return has_clip ? fmin(fmax(x, -clip), clip) : x;
}

// Step `step`'s time index for an element of length `length`, or -1 past its length.
inline int step_time(const int step, const int length, const int reverse) {
    if (step >= length)
        return -1;
    return reverse ? length - 1 - step : step;
}

// The cell update of unit j from its four gate pre-activations (recurrent + input parts): writes the new
// cell state over *c and returns the new hidden state.
inline float cell_update(float pi, float po, float pf, const float pc, __global float* c,
                         __global const float* restrict peep, const int has_peep, const int H, const int j,
                         const int has_clip, const float clip, const int input_forget)
{
    const float c_prev = *c;
    if (has_peep) {
        pi += peep[j] * c_prev;
        pf += peep[2 * H + j] * c_prev;
    }
    const float i = sigmoid(bound(pi, has_clip, clip));
    const float f = input_forget ? 1.0f - i : sigmoid(bound(pf, has_clip, clip));
    const float c_new = f * c_prev + i * tanh(bound(pc, has_clip, clip));
    if (has_peep)
        po += peep[H + j] * c_new;
    const float o = sigmoid(bound(po, has_clip, clip));
    *c = c_new;
    return o * tanh(c_new);
}

__kernel void lstm_cell(__global const float* restrict gates, __global const float* restrict xw,
                        __global float* restrict c, __global const float* restrict h_prev,
                        __global float* restrict h_next, const int a_width, const int kp,
                        __global float* restrict y, __global float* restrict h_out,
                        __global const float* restrict peep, const int has_peep,
                        const int H, const int has_clip, const float clip, const int input_forget,
                        __global const int* restrict lengths, const int has_lengths,
                        const int step, const int seq, const int batch, const int reverse,
                        const int dirs, const int d)
{
    const int j = get_global_id(0);
    const int b = get_global_id(1);
    if (j >= H)
        return;
    const long panel = ((long)(b / a_width) * kp + j) * a_width + b % a_width;
    const int t = step_time(step, has_lengths ? lengths[b] : seq, reverse);
    if (t < 0) {
        h_next[panel] = h_prev[panel];  // past this element's length (Y stays zero there)
        return;
    }
    const long row = (long)b * 4 * H;
    __global const float* x = xw + ((long)t * batch) * 4 * H + row;
    const float h = cell_update(gates[row + j] + x[j], gates[row + H + j] + x[H + j],
                                gates[row + 2 * H + j] + x[2 * H + j], gates[row + 3 * H + j] + x[3 * H + j],
                                c + b * H + j, peep, has_peep, H, j, has_clip, clip, input_forget);
    h_out[b * H + j] = h;
    y[(((long)t * dirs + d) * batch + b) * H + j] = h;
    h_next[panel] = h;
}

#ifdef LSTM_BATCH
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

#if LSTM_VEC == 1
typedef float step_vec;
#define HSUM(v) (v)
#else
typedef CAT(float, LSTM_VEC) step_vec;
inline float hsum4(const float4 v) { return (v.s0 + v.s1) + (v.s2 + v.s3); }
#if LSTM_VEC == 4
#define HSUM(v) hsum4(v)
#elif LSTM_VEC == 8
#define HSUM(v) hsum4((v).lo + (v).hi)
#else
#define HSUM(v) hsum4((v).lo.lo + (v).lo.hi + (v).hi.lo + (v).hi.hi)
#endif
#endif

// The end of a fused step for element b, unit j, given its four gate sums h_prev . R[g * H + j].
inline void finish_step(const float si, const float so, const float sf, const float sc, const int b,
                        const int j, const int kp, __global const float* restrict xw,
                        __global float* restrict c, __global const float* restrict h_prev,
                        __global float* restrict h_next, __global float* restrict y,
                        __global float* restrict h_out, __global const float* restrict peep,
                        const int has_peep, const int H, const int has_clip, const float clip,
                        const int input_forget, __global const int* restrict lengths, const int has_lengths,
                        const int step, const int seq, const int reverse, const int dirs, const int d)
{
    const int t = step_time(step, has_lengths ? lengths[b] : seq, reverse);
    if (t < 0) {
        h_next[b * kp + j] = h_prev[b * kp + j];  // past this element's length (Y stays zero there)
        return;
    }
    __global const float* x = xw + ((long)t * LSTM_BATCH + b) * 4 * H + j;
    const float h = cell_update(si + x[0], so + x[H], sf + x[2 * H], sc + x[3 * H], c + b * H + j, peep,
                                has_peep, H, j, has_clip, clip, input_forget);
    h_out[b * H + j] = h;
    y[(((long)t * dirs + d) * LSTM_BATCH + b) * H + j] = h;
    h_next[b * kp + j] = h;
}

__kernel __attribute__((reqd_work_group_size(LSTM_UNITS * LSTM_LANES, 1, 1)))
void lstm_step(__global const float* restrict r, const int kp, __global const float* restrict xw,
               __global float* restrict c, __global const float* restrict h_prev,
               __global float* restrict h_next,
               __global float* restrict y, __global float* restrict h_out,
               __global const float* restrict peep, const int has_peep,
               const int H, const int has_clip, const float clip, const int input_forget,
               __global const int* restrict lengths, const int has_lengths,
               const int step, const int seq, const int reverse, const int dirs, const int d)
{
    const int lid = get_local_id(0);
    const int lane = lid % LSTM_LANES;
    const int u = lid / LSTM_LANES;  // the work-item's unit within the group
    const int j = get_group_id(0) * LSTM_UNITS + u;
    // acc[g][b]: the work-item's share of h_prev[b] . R[g * H + j], one vector of k each.
    // The loops over acc are unrolled so that it lives in registers (PoCL otherwise keeps it in memory).
    step_vec acc[4][LSTM_BATCH];
    #pragma unroll
    for (int g = 0; g < 4; ++g)
        #pragma unroll
        for (int b = 0; b < LSTM_BATCH; ++b)
            acc[g][b] = (step_vec)(0.0f);
    if (j < H) {
        // Rows of R and states are kp floats, kp a multiple of LSTM_VEC * LSTM_LANES, zero past H: no
        // tail, and vector reads are aligned (plain dereferences: PoCL calls vloadN out of line).
        const int vectors = kp / LSTM_VEC;
        __global const step_vec* w = (__global const step_vec*)(r + (long)j * kp);
        __global const step_vec* h = (__global const step_vec*)h_prev;
        const long gate = (long)H * vectors;  // from one gate's rows to the next
        for (int k = lane; k < vectors; k += LSTM_LANES) {
            #pragma unroll
            for (int b = 0; b < LSTM_BATCH; ++b) {
                const step_vec hk = h[b * vectors + k];
                // a * b + c rather than mad(): PoCL calls the vector mad() out of line, unfused.
                #pragma unroll
                for (int g = 0; g < 4; ++g)
                    acc[g][b] += w[g * gate + k] * hk;
            }
        }
    }
#if LSTM_LANES == 1
    // One work-item per unit: its sums are whole, no reduction.
    if (j >= H)
        return;
    #pragma unroll
    for (int b = 0; b < LSTM_BATCH; ++b)
        finish_step(HSUM(acc[0][b]), HSUM(acc[1][b]), HSUM(acc[2][b]), HSUM(acc[3][b]), b, j, kp, xw, c,
                    h_prev, h_next, y, h_out, peep, has_peep, H, has_clip, clip, input_forget, lengths,
                    has_lengths, step, seq, reverse, dirs, d);
#else
    // partial[u][g][b][lane]: lanes innermost, so a row's reduction reads neighbouring words.
    __local float partial[LSTM_UNITS * 4 * LSTM_BATCH * LSTM_LANES];
    __local float* mine = partial + u * 4 * LSTM_BATCH * LSTM_LANES + lane;
    #pragma unroll
    for (int g = 0; g < 4; ++g)
        #pragma unroll
        for (int b = 0; b < LSTM_BATCH; ++b)
            mine[(g * LSTM_BATCH + b) * LSTM_LANES] = HSUM(acc[g][b]);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = LSTM_LANES / 2; s > 0; s >>= 1) {
        if (lane < s)
            for (int i = 0; i < 4 * LSTM_BATCH; ++i)
                mine[i * LSTM_LANES] += mine[i * LSTM_LANES + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    // Lane b of each unit finishes element b (and b + LSTM_LANES, ... when the batch is wider).
    if (j >= H)
        return;
    for (int b = lane; b < LSTM_BATCH; b += LSTM_LANES) {
        __local const float* sums = partial + (u * 4 * LSTM_BATCH + b) * LSTM_LANES;
        const int g = LSTM_BATCH * LSTM_LANES;  // from one gate's sums to the next
        finish_step(sums[0], sums[g], sums[2 * g], sums[3 * g], b, j, kp, xw, c, h_prev, h_next, y, h_out,
                    peep, has_peep, H, has_clip, clip, input_forget, lengths, has_lengths, step, seq,
                    reverse, dirs, d);
    }
#endif
}
#endif
