// Pooling on NCHW float32 (2-D; 1-D pools come as H = 1).
//
// Windowed pools: one work-item per output element; the window starts at (oh * SH - PH, ow * SW - PW)
// and its taps are DH / DW apart. MaxPool ignores taps outside the input (padding never wins).
// AveragePool divides by the taps on the input, or with count_include_pad by the taps inside the
// padded extent [-PH, H + PEH) x [-PW, W + PEW): ceil_mode's overhang past the end padding is never
// counted (the geometry in hetflow/ops/spatial.py defines both). Global size (OW, OH, N * C).
__kernel void pool2d(__global const float* restrict x, __global float* restrict y,
                     const int H, const int W, const int OH, const int OW,
                     const int KH, const int KW, const int SH, const int SW, const int PH, const int PW,
                     const int DH, const int DW, const int PEH, const int PEW, const int include_pad)
{
    const int ow = get_global_id(0);
    const int oh = get_global_id(1);
    const int nc = get_global_id(2);
    if (ow >= OW || oh >= OH)
        return;
    __global const float* xc = x + (long)nc * H * W;
    const int h0 = oh * SH - PH, w0 = ow * SW - PW;
#if MAX
    float acc = -INFINITY;
#else
    float acc = 0.0f;
    int count = 0;
#endif
    for (int kh = 0; kh < KH; ++kh) {
        const int ih = h0 + kh * DH;
        for (int kw = 0; kw < KW; ++kw) {
            const int iw = w0 + kw * DW;
            const int inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
#if MAX
            if (inside) {
                const float v = xc[ih * W + iw];
                // NaN propagates, as numpy's maximum does.
                acc = (v > acc || isnan(v)) ? v : acc;
            }
#else
            if (inside)
                acc += xc[ih * W + iw];
            if (include_pad)
                count += ih >= -PH && ih < H + PEH && iw >= -PW && iw < W + PEW;
            else
                count += inside;
#endif
        }
    }
#if MAX
    y[((long)nc * OH + oh) * OW + ow] = acc;
#else
    y[((long)nc * OH + oh) * OW + ow] = acc / (float)count;
#endif
}

// Global pools: one work-item per (image, channel) plane of P elements. Global size (N * C).
__kernel void global_pool(__global const float* restrict x, __global float* restrict y, const int P)
{
    const int nc = get_global_id(0);
    __global const float* xc = x + (long)nc * P;
#if MAX
    float acc = -INFINITY;
    for (int i = 0; i < P; ++i) {
        const float v = xc[i];
        acc = (v > acc || isnan(v)) ? v : acc;
    }
    y[nc] = acc;
#else
    float acc = 0.0f;
    for (int i = 0; i < P; ++i)
        acc += xc[i];
    y[nc] = acc / (float)P;
#endif
}
