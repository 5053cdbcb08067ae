// dequant_gemv.cu: y = x @ W for a few rows of x, with W stored quantized and dequantized in registers (lesson 13).
//
// What it computes (the same as minitransformer.quantize.QuantizedLinear's NumPy path):
//   y[b, o] = sum_i x[b, i] * W[o, i],  x (B, in) float32, y (B, out) float32, W (out, in) quantized as
//   int8:  W[o, i] = q[o, i] * scale[o]                       q (out, in) int8, scale (out,) float32
//   int4:  W[o, i] = q[o, i] * scale[o, g] + min[o, g], g = i / 32, q packed two per byte: byte k of a row holds
//          q[2k] in its low nibble and q[2k + 1] in its high nibble; packed (out, in / 2), scale, min (out, in / 32)
//          float16.
//
// Why a kernel: decode multiplies one row per sequence by every weight matrix, so it is bound by the bytes of
// weights it reads, not by arithmetic. Dequantizing to a float32 matrix first (what the NumPy path does, a block at
// a time) writes and reads 4 bytes per weight again; here each weight crosses memory once, as 1 byte (int8) or half
// a byte (int4), and becomes a float only in a register.
//
// Layout of the work: grid = (ceil(out / ROWS_PER_BLOCK), ceil(B / MAX_BATCH)), block = ROWS_PER_BLOCK warps.
//   Warp w of block x owns output row o = x * ROWS_PER_BLOCK + w. Its 32 lanes read the row in 4-byte words, lane l
//   taking words l, l + 32, ...: consecutive lanes read consecutive words (coalesced). Each weight is dequantized once
//   and multiplied into the MAX_BATCH rows of x (accumulators in registers), so the row is read once per launch for
//   up to MAX_BATCH sequences. A warp reduction finishes each dot product; lane 0 writes y.
//   No shared memory and no __syncthreads: warps never share data.
// Requirements (checked by kernels/quant.py): int8 in % 4 == 0 (word loads stay aligned); int4 in % 32 == 0.
#include "common.cuh"

constexpr int GEMV_ROWS_PER_BLOCK = 4;   // warps per block, one output row each

// One 4-byte word of int8 weights: 4 values starting at column i, scaled at the end (one scale per row).
template <int ROWS_PER_BLOCK, int MAX_BATCH>
__global__ void
dequant_gemv_int8(const float* __restrict__ x,            // (B, in)
                  const signed char* __restrict__ q,      // (out, in)
                  const float* __restrict__ scale,        // (out,)
                  float* __restrict__ y,                  // (B, out)
                  int batch, int in_features, int out_features) {
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const int o = blockIdx.x * ROWS_PER_BLOCK + warp;
    const int b0 = blockIdx.y * MAX_BATCH;                // first row of x this block handles
    if (o >= out_features) return;                        // a whole warp leaves: no collective is skipped
    const int nb = min(MAX_BATCH, batch - b0);

    float acc[MAX_BATCH];
#pragma unroll
    for (int b = 0; b < MAX_BATCH; ++b) acc[b] = 0.0f;

    const unsigned* row = reinterpret_cast<const unsigned*>(q + (size_t)o * in_features);
    const int words = in_features / 4;
    for (int w = lane; w < words; w += WARP_SIZE) {
        const unsigned word = row[w];
        float wv[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) wv[j] = (float)(signed char)(word >> (8 * j));   // sign-extend byte j
#pragma unroll
        for (int b = 0; b < MAX_BATCH; ++b) {
            if (b < nb) {
                const float* xr = x + (size_t)(b0 + b) * in_features + 4 * w;
                acc[b] += xr[0] * wv[0] + xr[1] * wv[1] + xr[2] * wv[2] + xr[3] * wv[3];
            }
        }
    }
    const float s = scale[o];
#pragma unroll
    for (int b = 0; b < MAX_BATCH; ++b) {
        const float total = warp_sum(acc[b]);             // every lane takes part, even for b >= nb
        if (lane == 0 && b < nb) y[(size_t)(b0 + b) * out_features + o] = total * s;
    }
}

// One 4-byte word of packed int4 weights: 8 values starting at column 8 * w, all in group (8 * w) / 32.
template <int ROWS_PER_BLOCK, int MAX_BATCH>
__global__ void
dequant_gemv_int4(const float* __restrict__ x,            // (B, in)
                  const unsigned char* __restrict__ packed, // (out, in / 2)
                  const __half* __restrict__ scale,       // (out, in / 32)
                  const __half* __restrict__ minimum,     // (out, in / 32)
                  float* __restrict__ y,                  // (B, out)
                  int batch, int in_features, int out_features) {
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const int o = blockIdx.x * ROWS_PER_BLOCK + warp;
    const int b0 = blockIdx.y * MAX_BATCH;
    if (o >= out_features) return;
    const int nb = min(MAX_BATCH, batch - b0);
    const int groups = in_features / 32;

    float acc[MAX_BATCH];
#pragma unroll
    for (int b = 0; b < MAX_BATCH; ++b) acc[b] = 0.0f;

    const unsigned* row = reinterpret_cast<const unsigned*>(packed + (size_t)o * (in_features / 2));
    const int words = in_features / 8;
    for (int w = lane; w < words; w += WARP_SIZE) {
        const unsigned word = row[w];
        const int g = w / 4;                              // 4 words = 16 bytes = 32 values = one group
        const float d = to_float(scale[(size_t)o * groups + g]);
        const float m = to_float(minimum[(size_t)o * groups + g]);
        float wv[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) wv[j] = (float)((word >> (4 * j)) & 0xFu) * d + m;   // nibble j = value 8w + j
#pragma unroll
        for (int b = 0; b < MAX_BATCH; ++b) {
            if (b < nb) {
                const float* xr = x + (size_t)(b0 + b) * in_features + 8 * w;
                float dot = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; ++j) dot += xr[j] * wv[j];
                acc[b] += dot;
            }
        }
    }
#pragma unroll
    for (int b = 0; b < MAX_BATCH; ++b) {
        const float total = warp_sum(acc[b]);
        if (lane == 0 && b < nb) y[(size_t)(b0 + b) * out_features + o] = total;
    }
}
