// Convolution kernels on NCHW float32 (2-D; 1-D convolutions come as H = 1). Prepended by epilogue.cl.
//
// Every kernel takes the window as (KH, KW), strides (SH, SW), pads before (PH, PW), dilations (DH, DW);
// padding past the end needs no argument: taps outside the input read zero.

// im2col written straight into the GEMM's B panels (see gemm.cl): matrix z = n * group + g is the
// [R = Cg * KH * KW, P = OH * OW] column matrix of image n, group g; element (r, p) lands at
// panels[z][p / width][r][p % width], zero where r >= R or p >= P (the padding the GEMM expects).
// Global size (Np, Kp, N * group).
__kernel void im2col_panels(__global const float* restrict x, __global float* restrict panels,
                            const int C, const int H, const int W, const int group, const int Cg,
                            const int KH, const int KW, const int OH, const int OW,
                            const int SH, const int SW, const int PH, const int PW,
                            const int DH, const int DW,
                            const int R, const int P, const int Kp, const int Np, const int width)
{
    const int p = get_global_id(0);
    const int r = get_global_id(1);
    const int z = get_global_id(2);
    float v = 0.0f;
    if (p < P && r < R) {
        const int n = z / group, g = z % group;
        const int taps = KH * KW;
        const int c = r / taps, t = r % taps;
        const int kh = t / KW, kw = t % KW;
        const int oh = p / OW, ow = p % OW;
        const int ih = oh * SH - PH + kh * DH;
        const int iw = ow * SW - PW + kw * DW;
        if (ih >= 0 && ih < H && iw >= 0 && iw < W)
            v = x[(((long)n * C + g * Cg + c) * H + ih) * W + iw];
    }
    panels[(((long)z * (Np / width) + p / width) * Kp + r) * width + p % width] = v;
}

// Direct convolution, any group: one work-item per output element, the reduction over the group's
// input channels and the window in registers. Global size (OH * OW, K, N).
__kernel void conv_direct(__global const float* restrict x, __global const float* restrict w,
                          __global const float* restrict bias, const int has_bias,
                          __global float* restrict y,
                          const int C, const int H, const int W, const int K, const int Cg, const int Kg,
                          const int KH, const int KW, const int OH, const int OW,
                          const int SH, const int SW, const int PH, const int PW,
                          const int DH, const int DW, const float act_a, const float act_b)
{
    const int p = get_global_id(0);
    const int k = get_global_id(1);
    const int n = get_global_id(2);
    if (p >= OH * OW)
        return;
    const int oh = p / OW, ow = p % OW;
    const int g = k / Kg;
    __global const float* xg = x + ((long)n * C + g * Cg) * H * W;
    __global const float* wk = w + (long)k * Cg * KH * KW;
    float acc = 0.0f;
    for (int c = 0; c < Cg; ++c) {
        for (int kh = 0; kh < KH; ++kh) {
            const int ih = oh * SH - PH + kh * DH;
            if (ih < 0 || ih >= H)
                continue;
            for (int kw = 0; kw < KW; ++kw) {
                const int iw = ow * SW - PW + kw * DW;
                if (iw >= 0 && iw < W)
                    acc += xg[(c * H + ih) * W + iw] * wk[(c * KH + kh) * KW + kw];
            }
        }
    }
    if (has_bias)
        acc += bias[k];
    y[((long)n * K + k) * OH * OW + p] = activate(acc, act_a, act_b);
}

// Depthwise convolution (group == C, channel multiplier K / C): output channel k reads input channel
// k / multiplier only, so the reduction is the window alone. Global size (OW, OH, N * K).
__kernel void conv_depthwise(__global const float* restrict x, __global const float* restrict w,
                             __global const float* restrict bias, const int has_bias,
                             __global float* restrict y,
                             const int C, const int H, const int W, const int K, const int multiplier,
                             const int KH, const int KW, const int OH, const int OW,
                             const int SH, const int SW, const int PH, const int PW,
                             const int DH, const int DW, const float act_a, const float act_b)
{
    const int ow = get_global_id(0);
    const int oh = get_global_id(1);
    const int nk = get_global_id(2);
    if (ow >= OW || oh >= OH)
        return;
    const int n = nk / K, k = nk % K;
    const int c = k / multiplier;
    __global const float* xc = x + ((long)n * C + c) * H * W;
    __global const float* wk = w + (long)k * KH * KW;
    float acc = 0.0f;
    for (int kh = 0; kh < KH; ++kh) {
        const int ih = oh * SH - PH + kh * DH;
        if (ih < 0 || ih >= H)
            continue;
        for (int kw = 0; kw < KW; ++kw) {
            const int iw = ow * SW - PW + kw * DW;
            if (iw >= 0 && iw < W)
                acc += xc[ih * W + iw] * wk[kh * KW + kw];
        }
    }
    if (has_bias)
        acc += bias[k];
    y[((long)nk * OH + oh) * OW + ow] = activate(acc, act_a, act_b);
}

// Bias per channel and the fused activation, in place on [N, K, P] (the GEMM's grouped output).
// Global size (P, K, N).
__kernel void channel_epilogue(__global float* restrict y, __global const float* restrict bias,
                               const int has_bias, const int K, const int P,
                               const float act_a, const float act_b)
{
    const int p = get_global_id(0);
    const int k = get_global_id(1);
    const int n = get_global_id(2);
    if (p >= P)
        return;
    const long i = ((long)n * K + k) * P + p;
    float v = y[i];
    if (has_bias)
        v += bias[k];
    y[i] = activate(v, act_a, act_b);
}

// Winograd F(2x2, 3x3), input side: each 4x4 input tile d (stride 2, starting at (2 th - PH, 2 tw - PW),
// zero outside X) becomes V = B^T d B, and its 16 values go to the B panels of 16 GEMMs
// (xi = 0..15): matrix xi is [C, T] with T = N * TH * TW tiles, element (c, t) at
// panels[xi][t / width][c][t % width]. Global size (Np, Kp): padding entries are written as zeros.
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]
__kernel void winograd_f23_input(__global const float* restrict x, __global float* restrict panels,
                                 const int C, const int H, const int W, const int TH, const int TW,
                                 const int PH, const int PW, const int T,
                                 const int Kp, const int Np, const int width)
{
    const int t = get_global_id(0);
    const int c = get_global_id(1);
    float d[4][4];
    if (t < T && c < C) {
        const int n = t / (TH * TW), rest = t % (TH * TW);
        const int h0 = (rest / TW) * 2 - PH, w0 = (rest % TW) * 2 - PW;
        __global const float* xc = x + ((long)n * C + c) * H * W;
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) {
                const int ih = h0 + i, iw = w0 + j;
                d[i][j] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? xc[ih * W + iw] : 0.0f;
            }
    } else {
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j)
                d[i][j] = 0.0f;
    }
    float u[4][4];  // B^T d
    for (int j = 0; j < 4; ++j) {
        u[0][j] = d[0][j] - d[2][j];
        u[1][j] = d[1][j] + d[2][j];
        u[2][j] = d[2][j] - d[1][j];
        u[3][j] = d[1][j] - d[3][j];
    }
    const long plane = (long)Kp * Np;
    const long at = ((long)(t / width) * Kp + c) * width + t % width;
    for (int i = 0; i < 4; ++i) {  // (B^T d) B
        panels[(i * 4 + 0) * plane + at] = u[i][0] - u[i][2];
        panels[(i * 4 + 1) * plane + at] = u[i][1] + u[i][2];
        panels[(i * 4 + 2) * plane + at] = u[i][2] - u[i][1];
        panels[(i * 4 + 3) * plane + at] = u[i][1] - u[i][3];
    }
}

// Winograd F(2x2, 3x3), output side: the 16 GEMM products m[xi] ([16, K, T]) of tile t and kernel k
// become Y = A^T m A (2x2), plus bias and the fused activation, cropped to the output.
// Global size (T, K).   A^T = [1 1 1 0; 0 1 -1 -1]
__kernel void winograd_f23_output(__global const float* restrict m, __global float* restrict y,
                                  __global const float* restrict bias, const int has_bias,
                                  const int K, const int OH, const int OW, const int TH, const int TW,
                                  const int T, const float act_a, const float act_b)
{
    const int t = get_global_id(0);
    const int k = get_global_id(1);
    if (t >= T)
        return;
    const long plane = (long)K * T;
    float v[4][4];
    for (int i = 0; i < 16; ++i)
        v[i / 4][i % 4] = m[i * plane + (long)k * T + t];
    float s[2][4];  // A^T v
    for (int j = 0; j < 4; ++j) {
        s[0][j] = v[0][j] + v[1][j] + v[2][j];
        s[1][j] = v[1][j] - v[2][j] - v[3][j];
    }
    const float b = has_bias ? bias[k] : 0.0f;
    const int n = t / (TH * TW), rest = t % (TH * TW);
    const int oh0 = (rest / TW) * 2, ow0 = (rest % TW) * 2;
    __global float* yk = y + ((long)n * K + k) * OH * OW;
    for (int i = 0; i < 2; ++i) {
        const float r0 = s[i][0] + s[i][1] + s[i][2];
        const float r1 = s[i][1] - s[i][2] - s[i][3];
        const int oh = oh0 + i;
        if (oh >= OH)
            break;
        yk[oh * OW + ow0] = activate(r0 + b, act_a, act_b);
        if (ow0 + 1 < OW)
            yk[oh * OW + ow0 + 1] = activate(r1 + b, act_a, act_b);
    }
}
