// flash_prefill.cu: causal grouped-query attention for a chunk of queries, FlashAttention-2 style (lesson 11).
//
// What it computes (the same as minitransformer.layers.attention):
//   out[b, h, i] = softmax_j( q[b, h, i] . k[b, h / G, j] * scale, keys j <= position of query i ) @ v[b, h / G]
//   q (B, H, Tq, d), k and v (B, K, Tk, d), out (B, H, Tq, d), lse (B, H, Tq), G = H / K query heads per KV head.
//   The Tq queries are the LAST Tq of the Tk positions: query i sits at position Tk - Tq + i, so the same kernel
//   runs a whole prompt (Tq = Tk) or a chunk that continues a cache (Tq < Tk).
//
// Why tiles: the (Tq, Tk) score matrix never exists. Each block streams the keys through shared memory one tile
// at a time and keeps, per query row, only a running max m, a running sum l and an unnormalised output acc:
//   m_new = max(m, max_j s_j)          p_j = exp(s_j - m_new)          alpha = exp(m - m_new)
//   l     = l * alpha + sum_j p_j      acc = acc * alpha + sum_j p_j v_j
// and divides by l once at the very end (FlashAttention-2's order: Tri Dao, "FlashAttention-2: Faster Attention
// with Better Parallelism and Work Partitioning", 2023, Algorithm 1; the online softmax itself is Milakov &
// Gimelshein, "Online normalizer calculation for softmax", 2018).
//
// Thread / block mapping:
//   grid  = (ceil(Tq / BLOCK_Q), H, B): one block per tile of BLOCK_Q = 16 query rows of one head of one sequence.
//   block = 4 warps = 128 threads; warp w owns query rows 4w .. 4w + 3 of the tile.
//   Scores: lane j of a warp computes the score of key j of the current key tile (BLOCK_K = 32 keys, one per lane),
//           so max and sum over the tile are warp reductions (5 shuffles each).
//   Output: lane j owns the head dimensions j, j + 32, j + 64, ... (d / 32 of them) of its warp's rows; p_j reaches
//           every lane through a shuffle broadcast.
// Shared memory (float32, filled by all 128 threads together):
//   q_tile (BLOCK_Q, d) once per block; k_tile (BLOCK_K, d + 1) and v_tile (BLOCK_K, d) once per key tile. The +1
//   padding puts key j's element c in bank (j * (d + 1) + c) % 32, so 32 lanes reading 32 different keys at the
//   same c hit 32 different banks.
//
// Key tiles are visited from the last one down to the first, as FlashAttention-2's own kernel does (the tiles
// that need the causal mask come first). A row may then meet a tile in which every key lies in its future: its
// running max is still -inf and exp(-inf - (-inf)) would be NaN. The guard below subtracts 0 instead (the same
// guard as FlashAttention-2's softmax code). tests/test_kernels.py removes it to show the NaN appear.
//
// Not done here, on purpose: tensor cores, double-buffered tile loads, sharing one K/V tile between the G query
// heads of a group. Each is a speed-up that would hide the recurrence this file is meant to show.
#include "common.cuh"

constexpr int PREFILL_WARPS = 4;
constexpr int PREFILL_ROWS_PER_WARP = 4;
constexpr int PREFILL_BLOCK_Q = 16;             // = PREFILL_WARPS * PREFILL_ROWS_PER_WARP query rows per block
constexpr int PREFILL_BLOCK_K = 32;             // = WARP_SIZE keys per tile: one per lane
constexpr int PREFILL_THREADS = 128;            // = PREFILL_WARPS * WARP_SIZE

template <typename T, int D>
__global__ void
flash_prefill(const T* __restrict__ q,  // (B, H, Tq, D)
              const T* __restrict__ k,  // (B, K, Tk, D)
              const T* __restrict__ v,  // (B, K, Tk, D)
              T* __restrict__ out,      // (B, H, Tq, D)
              float* __restrict__ lse,  // (B, H, Tq): log-sum-exp of each row's scores
              int num_heads, int num_kv_heads, int q_len, int kv_len, float scale) {
    static_assert(D % WARP_SIZE == 0, "head_dim must be a multiple of 32");
    static_assert(PREFILL_BLOCK_Q == PREFILL_WARPS * PREFILL_ROWS_PER_WARP, "rows per block");
    static_assert(PREFILL_BLOCK_K == WARP_SIZE, "one key per lane");
    static_assert(PREFILL_THREADS == PREFILL_WARPS * WARP_SIZE, "one warp per group of rows");
    constexpr int DIMS_PER_LANE = D / WARP_SIZE;
    constexpr int K_STRIDE = D + 1;                              // padded row of k_tile (bank conflicts)

    extern __shared__ float smem[];
    float* q_tile = smem;                                        // (BLOCK_Q, D)
    float* k_tile = q_tile + PREFILL_BLOCK_Q * D;                // (BLOCK_K, D + 1)
    float* v_tile = k_tile + PREFILL_BLOCK_K * K_STRIDE;         // (BLOCK_K, D)

    const int b = blockIdx.z;
    const int h = blockIdx.y;
    const int q_start = blockIdx.x * PREFILL_BLOCK_Q;            // first query row of this block
    const int kv_head = h / (num_heads / num_kv_heads);          // GQA: G consecutive query heads share a KV head
    const int first_pos = kv_len - q_len;                        // position of query row 0
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;

    const T* q_bh = q + (size_t)(b * num_heads + h) * q_len * D;              // (Tq, D)
    const T* k_bh = k + (size_t)(b * num_kv_heads + kv_head) * kv_len * D;    // (Tk, D)
    const T* v_bh = v + (size_t)(b * num_kv_heads + kv_head) * kv_len * D;    // (Tk, D)

    // 1. This block's query rows, as float32 (rows past Tq are zeros and never written back).
    for (int i = threadIdx.x; i < PREFILL_BLOCK_Q * D; i += blockDim.x) {
        const int row = i / D, col = i % D;
        q_tile[i] = (q_start + row < q_len) ? to_float(q_bh[(size_t)(q_start + row) * D + col]) : 0.0f;
    }

    // 2. Running state of this warp's rows, in registers: max m, sum l, unnormalised output acc.
    float m[PREFILL_ROWS_PER_WARP], l[PREFILL_ROWS_PER_WARP], acc[PREFILL_ROWS_PER_WARP][DIMS_PER_LANE];
#pragma unroll
    for (int r = 0; r < PREFILL_ROWS_PER_WARP; ++r) {
        m[r] = neg_inf();
        l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < DIMS_PER_LANE; ++i) acc[r][i] = 0.0f;
    }

    // 3. The keys this block needs: 0 .. position of its last valid row (causal: nothing later is visible).
    const int last_row = min(q_start + PREFILL_BLOCK_Q, q_len) - 1;
    const int num_keys = first_pos + last_row + 1;
    const int num_tiles = (num_keys + PREFILL_BLOCK_K - 1) / PREFILL_BLOCK_K;

    for (int tile = num_tiles - 1; tile >= 0; --tile) {
        const int k_start = tile * PREFILL_BLOCK_K;

        __syncthreads();   // every warp is done with the previous tile (and q_tile is complete) before overwriting
        for (int i = threadIdx.x; i < PREFILL_BLOCK_K * D; i += blockDim.x) {
            const int j = i / D, col = i % D;
            const int key = k_start + j;
            const bool real = key < kv_len;                      // the last tile may run past Tk
            k_tile[j * K_STRIDE + col] = real ? to_float(k_bh[(size_t)key * D + col]) : 0.0f;
            v_tile[j * D + col] = real ? to_float(v_bh[(size_t)key * D + col]) : 0.0f;
        }
        __syncthreads();   // the tile is complete before anyone reads it

        const int key = k_start + lane;                          // this lane's key
#pragma unroll
        for (int r = 0; r < PREFILL_ROWS_PER_WARP; ++r) {
            const int row = warp * PREFILL_ROWS_PER_WARP + r;
            const int pos = first_pos + q_start + row;
            const bool visible = (q_start + row < q_len) && key <= pos;   // causal mask (and padding rows)

            // Score of (row, key): a length-D dot product; q_tile reads are broadcasts, k_tile reads conflict-free.
            float s = neg_inf();
            if (visible) {
                float dot = 0.0f;
                const float* q_row = q_tile + row * D;
                const float* k_row = k_tile + lane * K_STRIDE;
#pragma unroll 8
                for (int c = 0; c < D; ++c) dot += q_row[c] * k_row[c];
                s = dot * scale;
            }

            // Online softmax update for this tile.
            const float m_new = fmaxf(m[r], warp_max(s));
            const float m_safe = (m_new == neg_inf()) ? 0.0f : m_new;   // all-masked guard: no -inf - -inf
            const float p = expf(s - m_safe);                          // 0 for masked keys
            const float alpha = expf(m[r] - m_safe);                   // rescales what earlier tiles summed
            l[r] = l[r] * alpha + warp_sum(p);
#pragma unroll
            for (int i = 0; i < DIMS_PER_LANE; ++i) acc[r][i] *= alpha;
#pragma unroll 8
            for (int j = 0; j < PREFILL_BLOCK_K; ++j) {
                const float p_j = __shfl_sync(FULL_MASK, p, j);        // lane j's probability, to every lane
#pragma unroll
                for (int i = 0; i < DIMS_PER_LANE; ++i) acc[r][i] += p_j * v_tile[j * D + lane + i * WARP_SIZE];
            }
            m[r] = m_new;
        }
    }

    // 4. Normalise once and write back; lse = m + log(l) lets a caller merge this result with others.
#pragma unroll
    for (int r = 0; r < PREFILL_ROWS_PER_WARP; ++r) {
        const int qi = q_start + warp * PREFILL_ROWS_PER_WARP + r;
        if (qi >= q_len) continue;
        T* out_row = out + ((size_t)(b * num_heads + h) * q_len + qi) * D;
        const float inv_l = 1.0f / l[r];
#pragma unroll
        for (int i = 0; i < DIMS_PER_LANE; ++i) out_row[lane + i * WARP_SIZE] = from_float<T>(acc[r][i] * inv_l);
        if (lane == 0) lse[(size_t)(b * num_heads + h) * q_len + qi] = m[r] + logf(l[r]);
    }
}
