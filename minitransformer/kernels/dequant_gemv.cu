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
// Layout of the work: grid = (ceil(out / ROWS_PER_BLOCK), ceil(B / MAX_BATCH)), block = GEMV_WARPS warps.
//   x is staged in shared memory once per block, GEMV_CHUNK columns of its (up to) MAX_BATCH rows at a time, with
//   16-byte loads; every warp of the block then reads it from there instead of from global memory.
//   Warp w owns ROWS_PER_BLOCK / GEMV_WARPS consecutive output rows and walks them together: per step each lane
//   issues one 16-byte load per row (16 int8 weights, or 32 int4 weights = one quantization group), all before any
//   is used, so a warp has that many 512-byte loads in flight. Each weight is dequantized once and multiplied into
//   the MAX_BATCH rows of x (accumulators in registers), so the weights are read once per launch for up to MAX_BATCH
//   sequences. A warp reduction finishes each dot product; lane 0 writes y.
// Requirements (checked by kernels/quant.py): int8 in % 16 == 0, int4 in % 32 == 0 (every row starts on a 16-byte
// boundary); x 16-byte aligned.
#include "common.cuh"

constexpr int GEMV_WARPS = 4;            // warps per block
constexpr int GEMV_ROWS_PER_BLOCK = 16;  // output rows per block: 4 per warp, their loads in flight together
constexpr int GEMV_CHUNK = 1024;         // columns of x staged in shared memory at a time (a multiple of 32)

// x[b0 .. b0 + nb) columns [k0, k0 + width) -> x_s (MAX_BATCH, GEMV_CHUNK), 4 floats per load.
__device__ __forceinline__ void stage_x(const float* __restrict__ x, float* x_s, int b0, int nb, int in_features,
                                        int k0, int width) {
    const int quads = width / 4;
    for (int i = threadIdx.x; i < nb * quads; i += blockDim.x) {
        const int b = i / quads, c = 4 * (i % quads);
        *reinterpret_cast<float4*>(x_s + b * GEMV_CHUNK + c) =
            *reinterpret_cast<const float4*>(x + (size_t)(b0 + b) * in_features + k0 + c);
    }
}

template <int ROWS_PER_BLOCK, int MAX_BATCH>
__global__ void __launch_bounds__(GEMV_WARPS * WARP_SIZE)
dequant_gemv_int8(const float* __restrict__ x,            // (B, in)
                  const signed char* __restrict__ q,      // (out, in)
                  const float* __restrict__ scale,        // (out,)
                  float* __restrict__ y,                  // (B, out)
                  int batch, int in_features, int out_features) {
    constexpr int ROWS = ROWS_PER_BLOCK / GEMV_WARPS;     // rows of this warp
    constexpr int VALS = 16;                              // int8 weights per 16-byte load
    static_assert(ROWS_PER_BLOCK % GEMV_WARPS == 0, "rows split evenly over the warps");
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const int row0 = blockIdx.x * ROWS_PER_BLOCK + warp * ROWS;
    const int b0 = blockIdx.y * MAX_BATCH;                // first row of x this block handles
    const int nb = min(MAX_BATCH, batch - b0);
    extern __shared__ float x_s[];                        // (MAX_BATCH, GEMV_CHUNK)

    float acc[ROWS][MAX_BATCH];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int b = 0; b < MAX_BATCH; ++b) acc[r][b] = 0.0f;

    for (int k0 = 0; k0 < in_features; k0 += GEMV_CHUNK) {
        const int width = min(GEMV_CHUNK, in_features - k0);
        stage_x(x, x_s, b0, nb, in_features, k0, width);
        __syncthreads();                                  // the chunk is in shared memory
        for (int c = lane * VALS; c < width; c += WARP_SIZE * VALS) {
            uint4 raw[ROWS];                              // rows past out_features (a whole warp's, at the end) read 0
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
                raw[r] = row0 + r < out_features ? load16(q + (size_t)(row0 + r) * in_features + k0 + c)
                                                 : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
            for (int w = 0; w < 4; ++w) {                 // word w: the weights of columns c + 4w .. c + 4w + 3
                float wv[ROWS][4];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    const unsigned words[4] = {raw[r].x, raw[r].y, raw[r].z, raw[r].w};
#pragma unroll
                    for (int j = 0; j < 4; ++j) wv[r][j] = (float)(signed char)(words[w] >> (8 * j));
                }
#pragma unroll
                for (int b = 0; b < MAX_BATCH; ++b) {
                    if (b < nb) {
                        const float4 xv = *reinterpret_cast<const float4*>(x_s + b * GEMV_CHUNK + c + 4 * w);
#pragma unroll
                        for (int r = 0; r < ROWS; ++r)
                            acc[r][b] += xv.x * wv[r][0] + xv.y * wv[r][1] + xv.z * wv[r][2] + xv.w * wv[r][3];
                    }
                }
            }
        }
        __syncthreads();                                  // every warp is done with the chunk before the next
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int o = row0 + r;
        const float s = o < out_features ? scale[o] : 0.0f;
#pragma unroll
        for (int b = 0; b < MAX_BATCH; ++b) {
            const float total = warp_sum(acc[r][b]);      // every lane takes part, even for b >= nb
            if (lane == 0 && b < nb && o < out_features) y[(size_t)(b0 + b) * out_features + o] = total * s;
        }
    }
}

// One 16-byte load of packed int4 weights: 32 values of columns c .. c + 31, exactly the quantization group c / 32.
template <int ROWS_PER_BLOCK, int MAX_BATCH>
__global__ void __launch_bounds__(GEMV_WARPS * WARP_SIZE)
dequant_gemv_int4(const float* __restrict__ x,            // (B, in)
                  const unsigned char* __restrict__ packed, // (out, in / 2)
                  const __half* __restrict__ scale,       // (out, in / 32)
                  const __half* __restrict__ minimum,     // (out, in / 32)
                  float* __restrict__ y,                  // (B, out)
                  int batch, int in_features, int out_features) {
    constexpr int ROWS = ROWS_PER_BLOCK / GEMV_WARPS;
    constexpr int VALS = 32;                              // int4 weights per 16-byte load: one group
    static_assert(ROWS_PER_BLOCK % GEMV_WARPS == 0, "rows split evenly over the warps");
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const int row0 = blockIdx.x * ROWS_PER_BLOCK + warp * ROWS;
    const int b0 = blockIdx.y * MAX_BATCH;
    const int nb = min(MAX_BATCH, batch - b0);
    const int groups = in_features / 32;
    extern __shared__ float x_s[];                        // (MAX_BATCH, GEMV_CHUNK)

    float acc[ROWS][MAX_BATCH];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int b = 0; b < MAX_BATCH; ++b) acc[r][b] = 0.0f;

    for (int k0 = 0; k0 < in_features; k0 += GEMV_CHUNK) {
        const int width = min(GEMV_CHUNK, in_features - k0);
        stage_x(x, x_s, b0, nb, in_features, k0, width);
        __syncthreads();
        for (int c = lane * VALS; c < width; c += WARP_SIZE * VALS) {
            const int g = (k0 + c) / 32;
            uint4 raw[ROWS];
            float d[ROWS], m[ROWS];                       // the group's scale and minimum, per row
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                const bool ok = row0 + r < out_features;
                const size_t row = ok ? row0 + r : 0;
                raw[r] = ok ? load16(packed + row * (in_features / 2) + (k0 + c) / 2) : make_uint4(0u, 0u, 0u, 0u);
                d[r] = ok ? to_float(scale[row * groups + g]) : 0.0f;
                m[r] = ok ? to_float(minimum[row * groups + g]) : 0.0f;
            }
#pragma unroll
            for (int w = 0; w < 4; ++w) {                 // word w: nibble j is the value of column c + 8w + j
                float wv[ROWS][8];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    const unsigned words[4] = {raw[r].x, raw[r].y, raw[r].z, raw[r].w};
#pragma unroll
                    for (int j = 0; j < 8; ++j) wv[r][j] = (float)((words[w] >> (4 * j)) & 0xFu) * d[r] + m[r];
                }
#pragma unroll
                for (int b = 0; b < MAX_BATCH; ++b) {
                    if (b < nb) {
                        const float4 x0 = *reinterpret_cast<const float4*>(x_s + b * GEMV_CHUNK + c + 8 * w);
                        const float4 x1 = *reinterpret_cast<const float4*>(x_s + b * GEMV_CHUNK + c + 8 * w + 4);
#pragma unroll
                        for (int r = 0; r < ROWS; ++r)
                            acc[r][b] += x0.x * wv[r][0] + x0.y * wv[r][1] + x0.z * wv[r][2] + x0.w * wv[r][3]
                                       + x1.x * wv[r][4] + x1.y * wv[r][5] + x1.z * wv[r][6] + x1.w * wv[r][7];
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int o = row0 + r;
#pragma unroll
        for (int b = 0; b < MAX_BATCH; ++b) {
            const float total = warp_sum(acc[r][b]);
            if (lane == 0 && b < nb && o < out_features) y[(size_t)(b0 + b) * out_features + o] = total;
        }
    }
}
