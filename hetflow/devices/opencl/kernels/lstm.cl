// One LSTM time step for every batch element and hidden unit, after the recurrent GEMM.
//
// gates [batch, 4H] = H_prev @ R^T (the tiled GEMM); xw [seq * batch, 4H] = X @ W^T + Wb + Rb for every
// step at once (one GEMM before the loop). Gates are stacked i, o, f, c (ONNX's order); peepholes
// P = [P_i, P_o, P_f]; clip bounds every pre-activation; the activations are ONNX's defaults
// (Sigmoid, Tanh, Tanh). The new cell state overwrites c in place (each work-item owns its element);
// the new hidden state goes to Y (at y_offset), to h_out (the final Y_h) and, in the GEMM's A-panel
// layout, to h_next for the next step's recurrent GEMM (padding entries are never written: they stay
// zero). With sequence lengths, steps past an element's length carry its state over, and the reverse
// direction runs backward within each element's own length (as the CPU kernel and ONNX Runtime do).
// Global size (H, batch).

inline float sigmoid(const float x) { return 1.0f / (1.0f + exp(-x)); }

inline float bound(const float x, const int has_clip, const float clip) {
    return has_clip ? fmin(fmax(x, -clip), clip) : x;
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
    const int length = has_lengths ? lengths[b] : seq;
    if (step >= length) {
        // Past this element's length: its state is carried over unchanged (Y stays zero there).
        h_next[panel] = h_prev[panel];
        return;
    }
    // The reverse direction runs backward within each element's own length.
    const int t = reverse ? length - 1 - step : step;
    const long row = (long)b * 4 * H;
    __global const float* x = xw + ((long)t * batch) * 4 * H + row;
    float pi = gates[row + j] + x[j];
    float po = gates[row + H + j] + x[H + j];
    float pf = gates[row + 2 * H + j] + x[2 * H + j];
    const float pc = gates[row + 3 * H + j] + x[3 * H + j];
    const float c_prev = c[b * H + j];
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
    const float h = o * tanh(c_new);
    c[b * H + j] = c_new;
    h_out[b * H + j] = h;
    y[(((long)t * dirs + d) * batch + b) * H + j] = h;
    h_next[panel] = h;
}
