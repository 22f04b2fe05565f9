// Backward kernels of a training step on NCHW float32 (launchers in backward.py).
//
// Windowed ops (Conv, MaxPool, AveragePool) come as 2-D: a 1-D op is a 2-D one over a height of 1.
// The input gradients are *gathers*: one work-item per input element sums what every window that read
// it contributes, so no two work-items write the same element and no atomics are needed. A window
// position (oh, ow) reads input row ih = oh * SH - PH + kh * DH: for input row h and tap kh it is the
// window oh = (h + PH - kh * DH) / SH when that division is exact and oh lies in [0, OH).

// -- reductions ---------------------------------------------------------------------------------------

// out[i] = sum of the P contiguous elements of row i. Global size (rows).
__kernel void row_sums(__global const float* restrict src, __global float* restrict out, const int P)
{
    const int i = get_global_id(0);
    __global const float* row = src + (long)i * P;
    float acc = 0.0f;
    for (int p = 0; p < P; ++p)
        acc += row[p];
    out[i] = acc;
}

// out[j] = scale * sum over the R rows of src[i][j] ([R, C] row-major). Global size (C).
__kernel void column_sums(__global const float* restrict src, __global float* restrict out,
                          const int R, const int C, const float scale)
{
    const int j = get_global_id(0);
    float acc = 0.0f;
    for (int i = 0; i < R; ++i)
        acc += src[(long)i * C + j];
    out[j] = scale * acc;
}

// -- Conv: weight gradient dW[g] = dY[g] . cols[g]^T ---------------------------------------------------
// The reduction runs over (image, position); it is split into S chunks of NS images so that small
// layers still give every compute unit work: matrix z = g * S + s of one batched GEMM covers group g's
// images s * NS ... s * NS + NS - 1 (images past N read as zeros), and split_sums adds the S partial
// products. Both operands are written straight into the GEMM's packed panels ([rows / width][Kp][width],
// see gemm.cl).

// A: dY of group g as [KG, NS * P] (row = output channel, reduction = (image, position)).
// Global size (Mp, Kp, G * S).
__kernel void conv_dw_pack_dy(__global const float* restrict dy, __global float* restrict panels,
                              const int N, const int K, const int P, const int KG, const int S, const int NS,
                              const int Mp, const int Kp, const int width)
{
    const int i = get_global_id(0);
    const int r = get_global_id(1);
    const int z = get_global_id(2);
    const int g = z / S, s = z % S;
    const int n = s * NS + r / P, p = r % P;
    float v = 0.0f;
    if (i < KG && r < NS * P && n < N)
        v = dy[((long)n * K + g * KG + i) * P + p];
    panels[(((long)z * (Mp / width) + i / width) * Kp + r) * width + i % width] = v;
}

// B: the im2col columns of group g transposed, [NS * P, R] (reduction = (image, position), column j =
// (channel in group, kh, kw) as W flattens). Global size (Np, Kp, G * S).
__kernel void conv_dw_pack_cols(__global const float* restrict x, __global float* restrict panels,
                                const int N, const int C, const int H, const int W, const int CG,
                                const int KH, const int KW, const int OH, const int OW,
                                const int SH, const int SW, const int PH, const int PW,
                                const int DH, const int DW, const int S, const int NS,
                                const int R, const int Np, const int Kp, const int width)
{
    const int j = get_global_id(0);
    const int r = get_global_id(1);
    const int z = get_global_id(2);
    const int g = z / S, s = z % S;
    const int P = OH * OW;
    const int n = s * NS + r / P, p = r % P;
    float v = 0.0f;
    if (j < R && r < NS * P && n < N) {
        const int taps = KH * KW;
        const int c = j / taps, t = j % taps;
        const int kh = t / KW, kw = t % KW;
        const int oh = p / OW, ow = p % OW;
        const int ih = oh * SH - PH + kh * DH;
        const int iw = ow * SW - PW + kw * DW;
        if (ih >= 0 && ih < H && iw >= 0 && iw < W)
            v = x[(((long)n * C + g * CG + c) * H + ih) * W + iw];
    }
    panels[(((long)z * (Np / width) + j / width) * Kp + r) * width + j % width] = v;
}

// out[g][e] = sum over s of partial[g * S + s][e], E elements per matrix. Global size (E, G).
__kernel void split_sums(__global const float* restrict partial, __global float* restrict out,
                         const int S, const int E)
{
    const int e = get_global_id(0);
    const int g = get_global_id(1);
    float acc = 0.0f;
    for (int s = 0; s < S; ++s)
        acc += partial[((long)g * S + s) * E + e];
    out[(long)g * E + e] = acc;
}

// -- Conv: input gradient dX = col2im(W^T . dY) ------------------------------------------------------

// B: dY of image n and group g as [KG, P] (reduction = output channel, column = position).
// Global size (Np, Kp, N * G).
__kernel void conv_dx_pack_dy(__global const float* restrict dy, __global float* restrict panels,
                              const int K, const int P, const int G, const int KG,
                              const int Np, const int Kp, const int width)
{
    const int p = get_global_id(0);
    const int r = get_global_id(1);
    const int z = get_global_id(2);
    const int n = z / G, g = z % G;
    float v = 0.0f;
    if (p < P && r < KG)
        v = dy[((long)n * K + g * KG + r) * P + p];
    panels[(((long)z * (Np / width) + p / width) * Kp + r) * width + p % width] = v;
}

// The output index along one axis whose window reads input index i through tap k; -1 when none does.
inline int covering_output(const int i, const int k, const int out, const int stride, const int pad,
                           const int dilation)
{
    const int t = i + pad - k * dilation;
    if (t < 0 || t % stride)
        return -1;
    const int o = t / stride;
    return o < out ? o : -1;
}

// dX[n, c, h, w]: the sum of the column entries (matrix n * G + g, row (c', kh, kw), position (oh, ow))
// of every tap whose window reads (h, w). Global size (W, H, N * C).
__kernel void conv_col2im(__global const float* restrict dcols, __global float* restrict dx,
                          const int C, const int H, const int W, const int G, const int CG,
                          const int KH, const int KW, const int OH, const int OW,
                          const int SH, const int SW, const int PH, const int PW,
                          const int DH, const int DW)
{
    const int w = get_global_id(0);
    const int h = get_global_id(1);
    const int nc = get_global_id(2);
    const int n = nc / C, c = nc % C;
    const int g = c / CG, cl = c % CG;
    const int P = OH * OW;
    __global const float* cols = dcols + ((long)(n * G + g) * CG + cl) * KH * KW * P;
    float acc = 0.0f;
    for (int kh = 0; kh < KH; ++kh) {
        const int oh = covering_output(h, kh, OH, SH, PH, DH);
        if (oh < 0)
            continue;
        for (int kw = 0; kw < KW; ++kw) {
            const int ow = covering_output(w, kw, OW, SW, PW, DW);
            if (ow >= 0)
                acc += cols[(long)(kh * KW + kw) * P + oh * OW + ow];
        }
    }
    dx[((long)nc * H + h) * W + w] = acc;
}

// -- pooling ------------------------------------------------------------------------------------------

// MaxPool, pass 1: the winning tap of every window, as the forward picks it: the first maximum in
// row-major tap order, the first NaN if any, taps outside the input reading -inf. Global (OW, OH, N * C).
__kernel void maxpool_winners(__global const float* restrict x, __global int* restrict winners,
                              const int H, const int W, const int OH, const int OW,
                              const int KH, const int KW, const int SH, const int SW,
                              const int PH, const int PW, const int DH, const int DW)
{
    const int ow = get_global_id(0);
    const int oh = get_global_id(1);
    const int nc = get_global_id(2);
    __global const float* xc = x + (long)nc * H * W;
    const int h0 = oh * SH - PH, w0 = ow * SW - PW;
    float best = 0.0f;
    int winner = -1;
    for (int kh = 0; kh < KH; ++kh) {
        const int ih = h0 + kh * DH;
        for (int kw = 0; kw < KW; ++kw) {
            const int iw = w0 + kw * DW;
            const float v = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? xc[ih * W + iw] : -INFINITY;
            if (winner < 0 || v > best || (isnan(v) && !isnan(best))) {
                best = v;
                winner = kh * KW + kw;
            }
        }
    }
    winners[((long)nc * OH + oh) * OW + ow] = winner;
}

// MaxPool, pass 2: dX[h, w] sums dY of every window whose winner is the tap reading (h, w).
// Global (W, H, N * C).
__kernel void maxpool_scatter(__global const float* restrict dy, __global const int* restrict winners,
                              __global float* restrict dx,
                              const int H, const int W, const int OH, const int OW,
                              const int KH, const int KW, const int SH, const int SW,
                              const int PH, const int PW, const int DH, const int DW)
{
    const int w = get_global_id(0);
    const int h = get_global_id(1);
    const int nc = get_global_id(2);
    const long plane = (long)nc * OH * OW;
    float acc = 0.0f;
    for (int kh = 0; kh < KH; ++kh) {
        const int oh = covering_output(h, kh, OH, SH, PH, DH);
        if (oh < 0)
            continue;
        for (int kw = 0; kw < KW; ++kw) {
            const int ow = covering_output(w, kw, OW, SW, PW, DW);
            if (ow >= 0 && winners[plane + oh * OW + ow] == kh * KW + kw)
                acc += dy[plane + oh * OW + ow];
        }
    }
    dx[((long)nc * H + h) * W + w] = acc;
}

// Taps of window o along one axis that AveragePool counts: on the input, or with include_pad on the
// input or its explicit padding [-PB, size + PE) (ceil_mode's overhang is never counted).
int window_count(const int o, const int size, const int K, const int S, const int PB, const int D,
                 const int PE, const int include_pad)
{
    const int lo = include_pad ? -PB : 0, hi = include_pad ? size + PE : size;
    int count = 0;
    for (int k = 0; k < K; ++k) {
        const int i = o * S - PB + k * D;
        count += i >= lo && i < hi;
    }
    return count;
}

// AveragePool: dX[h, w] sums dY / divisor of every window that reads (h, w). Global (W, H, N * C).
__kernel void avgpool_scatter(__global const float* restrict dy, __global float* restrict dx,
                              const int H, const int W, const int OH, const int OW,
                              const int KH, const int KW, const int SH, const int SW,
                              const int PH, const int PW, const int DH, const int DW,
                              const int PEH, const int PEW, const int include_pad)
{
    const int w = get_global_id(0);
    const int h = get_global_id(1);
    const int nc = get_global_id(2);
    const long plane = (long)nc * OH * OW;
    float acc = 0.0f;
    for (int kh = 0; kh < KH; ++kh) {
        const int oh = covering_output(h, kh, OH, SH, PH, DH);
        if (oh < 0)
            continue;
        const int rows = window_count(oh, H, KH, SH, PH, DH, PEH, include_pad);
        for (int kw = 0; kw < KW; ++kw) {
            const int ow = covering_output(w, kw, OW, SW, PW, DW);
            if (ow >= 0) {
                const int cols = window_count(ow, W, KW, SW, PW, DW, PEW, include_pad);
                acc += dy[plane + oh * OW + ow] / (float)(rows * cols);
            }
        }
    }
    dx[((long)nc * H + h) * W + w] = acc;
}

// GlobalAveragePool: every one of a plane's P elements gets the plane's dY / P. Global (N * C * P).
__kernel void spread_planes(__global const float* restrict dy, __global float* restrict dx,
                            const int P, const float divisor)
{
    const long i = get_global_id(0);
    dx[i] = dy[i / P] / divisor;
}

// -- activations: dX from dY and the value the rule reads (X, or Y for Sigmoid and Tanh) ---------------
// The expressions follow hetflow/ops/activation.py's rules operation for operation, so float32
// results agree with numpy's to the rounding of a fused multiply-add at most.
#define GRAD(name, expr)                                                                              \
    __kernel void name(__global const float* restrict a_, __global const float* restrict dy,          \
                       __global float* restrict dx, const float p0, const float p1)                   \
    {                                                                                                  \
        const long i = get_global_id(0);                                                               \
        const float a = a_[i];                                                                         \
        const float g = dy[i];                                                                         \
        dx[i] = (expr);                                                                                \
    }

GRAD(relu_grad, a > 0.0f ? g : 0.0f)
GRAD(leaky_relu_grad, a >= 0.0f ? g : g * p0)
GRAD(clip_grad, (a >= p0 && a <= p1) ? g : 0.0f)
GRAD(sigmoid_grad, g * a * (1.0f - a))
GRAD(tanh_grad, g * (1.0f - a * a))

// -- softmax cross-entropy with integer labels ---------------------------------------------------------
// One work-item per row of [N, K] logits: loss[i] = log sum exp(l - max) - (l[label] - max) and the
// gradient row (softmax - onehot) / batch, from the shifted logits as hetflow/ops/loss.py computes them.
__kernel void softmax_xent(__global const float* restrict logits, __global const int* restrict labels,
                           __global float* restrict loss, __global float* restrict grad,
                           const int K, const float batch)
{
    const int i = get_global_id(0);
    __global const float* row = logits + (long)i * K;
    __global float* out = grad + (long)i * K;
    float top = row[0];
    for (int k = 1; k < K; ++k)
        top = fmax(top, row[k]);
    float total = 0.0f;
    for (int k = 0; k < K; ++k)
        total += exp(row[k] - top);
    const float log_sum = log(total);
    const int label = labels[i];
    loss[i] = log_sum - (row[label] - top);
    for (int k = 0; k < K; ++k) {
        const float p = exp(row[k] - top - log_sum);
        out[k] = (p - (k == label ? 1.0f : 0.0f)) / batch;
    }
}
