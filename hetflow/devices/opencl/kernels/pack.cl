// Packing a GEMM operand on the device, for operands that are already device buffers (activations
// flowing from node to node): the same zero-padded panel layout as gemm.py's pack_a / pack_b.
//
// Matrix z of the source has `rows` x `depth` elements, element (i, kk) at
//   src[z * batch_stride + i * row_stride + kk * depth_stride]
// (A: rows = M, depth = K; B: rows = N, depth = K; a transposed operand just swaps the strides; a
// batch stride of 0 repeats one matrix). Panels: [panels_per_matrix][Kp][width] per matrix, panel p
// holding rows p * width ... of the matrix, one kk-slice of `width` values after the other.
// Global size (Kp * width, panels_per_matrix, batch); padding is written as zeros.
__kernel void pack_panels(__global const float* restrict src, __global float* restrict panels,
                          const int rows, const int depth, const long batch_stride,
                          const long row_stride, const long depth_stride, const int width,
                          const int kp, const int panels_per_matrix)
{
    const int e = get_global_id(0);
    const int p = get_global_id(1);
    const int z = get_global_id(2);
    const int kk = e / width;
    const int i = p * width + e % width;
    float v = 0.0f;
    if (i < rows && kk < depth)
        v = src[z * batch_stride + i * row_stride + kk * depth_stride];
    panels[((long)z * panels_per_matrix + p) * kp * width + e] = v;
}
