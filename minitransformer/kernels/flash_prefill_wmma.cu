// flash_prefill_wmma.cu: flash_prefill.cu's attention on tensor cores, for float16 q, k, v (lesson 11).
//
// Same contract as flash_prefill.cu (read that file first): causal GQA attention of the last Tq of Tk positions,
// q (B, H, Tq, d), k and v (B, K, Tk, d) -> out (B, H, Tq, d) and lse (B, H, Tq), the same online softmax over key
// tiles visited last to first, the same guard for a tile whose keys all lie in a row's future. What changes is who
// does the two matrix products, S = Q K^T and O += P V:
//
// - A tensor core multiplies whole tiles. wmma::mma_sync(c, a, b, c) has one warp compute c += a b for 16x16
//   tiles a, b, c: 16 x 16 x 16 = 4096 multiply-adds in one warp-wide instruction sequence, where flash_prefill.cu
//   spends 4096 scalar FMAs spread over the lanes' loops. The inputs a and b are float16; each product of two
//   float16 numbers is exact in float32 and the sums are kept in float32 (c is float). So q, k, v stay float16,
//   and the softmax probabilities P are rounded to float16 before P V: the one new rounding of this kernel.
// - Fragments: a, b and c live in `wmma::fragment`s, spread over the 32 lanes' registers in a way CUDA leaves
//   unspecified. A kernel may only load them from memory (load_matrix_sync), multiply them (mma_sync), store them
//   (store_matrix_sync) and apply the same operation to every element. The online softmax needs more: the row
//   maximum of S, and a rescale of O row by row. S therefore goes through shared memory, where lanes read whole
//   rows; and O stays in registers because the kernel asks which row each element is in (see "row_of" below).
//   API: CUDA C++ Programming Guide, "Warp Matrix Functions"; needs sm_70 or newer.
//
// Thread / block mapping:
//   grid  = (ceil(Tq / BLOCK_Q), H, B): one block per 64 query rows of one head of one sequence.
//   block = 4 warps; warp w owns query rows 16w .. 16w + 15 of the block, the m of a 16x16x16 tile product.
//   Per key tile (BLOCK_K = 32 keys), each warp:
//   1. S (16, 32) = Q_w (16, d) K_tile^T (d, 32): 2 x d/16 mma_sync; Q_w's d/16 fragments are loaded once.
//   2. Online softmax: lane L takes row L / 2 and keys 16 (L % 2) .. 16 (L % 2) + 15 of the tile; one
//      __shfl_xor_sync(.., 1) joins the two halves of a row (max, then sum). P (float16) goes to shared memory.
//   3. O (16, d) = alpha O + P (16, 32) V_tile (32, d): d/16 accumulator fragments, for the whole kernel in
//      registers, each element scaled by its row's alpha, then d/16 x 2 mma_sync.
//   A warp whose 16 rows all lie before the tile skips 1-3 (the block's other warps may need the tile).
//
// Shared memory (dynamic, bytes for d = 64 / 128: 23808 / 32000):
//   k_tile, v_tile  (BLOCK_K, d + 8) float16 each, filled by all 128 threads with 16-byte loads. The row pitch of
//                   d + 8 halves starts each row 16 bytes further along the 32 banks (fewer bank conflicts in the
//                   fragment loads) and keeps every 16-row fragment 32-byte aligned, as load_matrix_sync requires.
//   q_stage         (BLOCK_Q, d + 8) float16: the block's queries, before the key loop only; it reuses the bytes
//                   of k_tile and v_tile.
//   per warp: s_tile (16, 32 + 4) float32 (scores; at the end, the output on its way out), p_tile (16, 32 + 8)
//   float16, row_scale (16) float32 (each row's alpha, at the end 1 / l).
//
// Not done here, on purpose: double-buffered tile loads, ldmatrix/mma.sync with a known register layout (which
// lets FlashAttention-2 keep S in registers too), sharing K/V tiles between the query heads of a group.
#include "common.cuh"
#include <mma.h>

using namespace nvcuda;

constexpr int WMMA_WARPS = 4;
constexpr int WMMA_BLOCK_Q = 64;               // = WMMA_WARPS * WMMA_TILE query rows per block
constexpr int WMMA_BLOCK_K = 32;               // keys per tile = 2 * WMMA_TILE: two lanes per row in the softmax
constexpr int WMMA_THREADS = 128;              // = WMMA_WARPS * WARP_SIZE
constexpr int WMMA_TILE = 16;                  // wmma's m = n = k
constexpr int WMMA_HALF_PAD = 8;               // halves added to each float16 row (16 bytes)
constexpr int WMMA_FLOAT_PAD = 4;              // floats added to each float32 row (16 bytes)

using FragQ = wmma::fragment<wmma::matrix_a, WMMA_TILE, WMMA_TILE, WMMA_TILE, __half, wmma::row_major>;
using FragP = FragQ;                           // P (16, 32) is a row-major A operand too
// K^T as a B operand: K is stored (keys, d) row-major, which is (d, keys) column-major: no transpose needed.
using FragKt = wmma::fragment<wmma::matrix_b, WMMA_TILE, WMMA_TILE, WMMA_TILE, __half, wmma::col_major>;
using FragV = wmma::fragment<wmma::matrix_b, WMMA_TILE, WMMA_TILE, WMMA_TILE, __half, wmma::row_major>;
using FragAcc = wmma::fragment<wmma::accumulator, WMMA_TILE, WMMA_TILE, WMMA_TILE, float>;

template <int D>
__global__ void __launch_bounds__(WMMA_THREADS)
flash_prefill_wmma(const __half* __restrict__ q,  // (B, H, Tq, D), 16-byte aligned (as k, v: vector loads)
                   const __half* __restrict__ k,  // (B, K, Tk, D)
                   const __half* __restrict__ v,  // (B, K, Tk, D)
                   __half* __restrict__ out,      // (B, H, Tq, D)
                   float* __restrict__ lse,       // (B, H, Tq)
                   int num_heads, int num_kv_heads, int q_len, int kv_len, float scale) {
    static_assert(D % (2 * WMMA_TILE) == 0, "head_dim: a multiple of 32 (the output leaves two tiles at a time)");
    static_assert(WMMA_BLOCK_Q == WMMA_WARPS * WMMA_TILE && WMMA_THREADS == WMMA_WARPS * WARP_SIZE, "warps");
    static_assert(WMMA_BLOCK_K == 2 * WMMA_TILE && WARP_SIZE == 2 * WMMA_TILE, "two lanes per row, 16 keys each");
    static_assert(WMMA_BLOCK_Q == 2 * WMMA_BLOCK_K, "q_stage fills exactly the bytes of k_tile and v_tile");
    constexpr int LDH = D + WMMA_HALF_PAD;                       // row pitch of k_tile, v_tile, q_stage
    constexpr int LDS = WMMA_BLOCK_K + WMMA_FLOAT_PAD;           // row pitch of s_tile
    constexpr int LDP = WMMA_BLOCK_K + WMMA_HALF_PAD;            // row pitch of p_tile
    constexpr int D_TILES = D / WMMA_TILE;
    constexpr int K_TILES = WMMA_BLOCK_K / WMMA_TILE;
    constexpr int VEC = 8;                                       // halves per 16-byte load (uint4)

    extern __shared__ __align__(128) unsigned char smem[];
    __half* k_tile = reinterpret_cast<__half*>(smem);                              // (BLOCK_K, LDH)
    __half* v_tile = k_tile + WMMA_BLOCK_K * LDH;                                  // (BLOCK_K, LDH)
    __half* q_stage = k_tile;                                                      // (BLOCK_Q, LDH), step 1 only
    float* s_all = reinterpret_cast<float*>(v_tile + WMMA_BLOCK_K * LDH);          // (WARPS, 16, LDS)
    __half* p_all = reinterpret_cast<__half*>(s_all + WMMA_WARPS * WMMA_TILE * LDS);   // (WARPS, 16, LDP)
    float* scale_all = reinterpret_cast<float*>(p_all + WMMA_WARPS * WMMA_TILE * LDP); // (WARPS, 16)

    const int b = blockIdx.z;
    const int h = blockIdx.y;
    const int q_start = blockIdx.x * WMMA_BLOCK_Q;               // first query row of this block
    const int kv_head = h / (num_heads / num_kv_heads);          // GQA: G consecutive query heads share a KV head
    const int first_pos = kv_len - q_len;                        // position of query row 0
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    float* s_tile = s_all + warp * WMMA_TILE * LDS;              // this warp's (16, LDS)
    __half* p_tile = p_all + warp * WMMA_TILE * LDP;             // this warp's (16, LDP)
    float* row_scale = scale_all + warp * WMMA_TILE;             // this warp's (16,)

    const __half* q_bh = q + (size_t)(b * num_heads + h) * q_len * D;             // (Tq, D)
    const __half* k_bh = k + (size_t)(b * num_kv_heads + kv_head) * kv_len * D;   // (Tk, D)
    const __half* v_bh = v + (size_t)(b * num_kv_heads + kv_head) * kv_len * D;   // (Tk, D)
    const uint4 zeros = {0u, 0u, 0u, 0u};

    // 1. The block's queries into shared memory (rows past Tq are zeros), then each warp's 16 rows into fragments.
    //    s_tile meanwhile holds a 16x16 matrix whose element (r, c) is r, for row_of below.
    for (int i = threadIdx.x; i < WMMA_BLOCK_Q * D / VEC; i += blockDim.x) {
        const int row = i / (D / VEC), col = i % (D / VEC) * VEC;
        const bool real = q_start + row < q_len;
        *reinterpret_cast<uint4*>(q_stage + row * LDH + col) =
            real ? *reinterpret_cast<const uint4*>(q_bh + (size_t)(q_start + row) * D + col) : zeros;
    }
    for (int i = lane; i < WMMA_TILE * WMMA_TILE; i += WARP_SIZE)
        s_tile[i / WMMA_TILE * LDS + i % WMMA_TILE] = float(i / WMMA_TILE);
    __syncthreads();   // q_stage and the row-index matrix are complete before any warp loads from them
    FragQ q_frag[D_TILES];
#pragma unroll
    for (int kk = 0; kk < D_TILES; ++kk)
        wmma::load_matrix_sync(q_frag[kk], q_stage + warp * WMMA_TILE * LDH + kk * WMMA_TILE, LDH);
    // row_of.x[i] is the row of element i of this lane's part of any accumulator fragment: CUDA does not say which
    // elements a lane holds, but all fragments of one type hold them alike, so loading the row numbers tells us.
    FragAcc row_of;
    wmma::load_matrix_sync(row_of, s_tile, LDS, wmma::mem_row_major);

    // 2. Running state. O in fragments; m and l of this lane's row (both lanes of a row keep the same values).
    FragAcc acc[D_TILES];
#pragma unroll
    for (int j = 0; j < D_TILES; ++j) wmma::fill_fragment(acc[j], 0.0f);
    const int r = lane / 2;                                      // this lane's row of the warp's 16
    const int c0 = lane % 2 * WMMA_TILE;                         // its first key of the tile
    const int qi = q_start + warp * WMMA_TILE + r;
    const int pos = first_pos + qi;
    const bool row_valid = qi < q_len;
    float m = neg_inf(), l = 0.0f;

    // 3. The keys this block needs: 0 .. position of its last valid row; this warp: 0 .. position of its last one.
    const int last_row = min(q_start + WMMA_BLOCK_Q, q_len) - 1;
    const int num_tiles = (first_pos + last_row + 1 + WMMA_BLOCK_K - 1) / WMMA_BLOCK_K;
    const int warp_rows = min(q_start + (warp + 1) * WMMA_TILE, q_len) - (q_start + warp * WMMA_TILE);
    const int warp_last_pos = first_pos + q_start + warp * WMMA_TILE + warp_rows - 1;

    for (int tile = num_tiles - 1; tile >= 0; --tile) {
        const int k_start = tile * WMMA_BLOCK_K;

        __syncthreads();   // every warp is done with the previous tile (the first time: with q_stage)
        for (int i = threadIdx.x; i < WMMA_BLOCK_K * D / VEC; i += blockDim.x) {
            const int j = i / (D / VEC), col = i % (D / VEC) * VEC;
            const int key = k_start + j;
            const bool real = key < kv_len;                      // the last tile may run past Tk
            *reinterpret_cast<uint4*>(k_tile + j * LDH + col) =
                real ? *reinterpret_cast<const uint4*>(k_bh + (size_t)key * D + col) : zeros;
            *reinterpret_cast<uint4*>(v_tile + j * LDH + col) =
                real ? *reinterpret_cast<const uint4*>(v_bh + (size_t)key * D + col) : zeros;
        }
        __syncthreads();   // the tile is complete before anyone reads it
        if (warp_rows <= 0 || k_start > warp_last_pos) continue;   // the same for all lanes: no divergence

        // 3a. S = Q_w K^T, stored to s_tile (row-major).
#pragma unroll
        for (int n = 0; n < K_TILES; ++n) {
            FragAcc s_frag;
            wmma::fill_fragment(s_frag, 0.0f);
#pragma unroll
            for (int kk = 0; kk < D_TILES; ++kk) {
                FragKt kt_frag;
                wmma::load_matrix_sync(kt_frag, k_tile + n * WMMA_TILE * LDH + kk * WMMA_TILE, LDH);
                wmma::mma_sync(s_frag, q_frag[kk], kt_frag, s_frag);
            }
            wmma::store_matrix_sync(s_tile + n * WMMA_TILE, s_frag, LDS, wmma::mem_row_major);
        }
        __syncwarp();      // every lane's part of S is stored before lanes read whole rows

        // 3b. Online softmax of (row r, keys c0 .. c0 + 15), as flash_prefill.cu but over two lanes per row.
        float s[WMMA_TILE];
        float tile_max = neg_inf();
#pragma unroll
        for (int c = 0; c < WMMA_TILE; ++c) {
            const bool visible = row_valid && k_start + c0 + c <= pos;   // causal mask (and padding rows)
            s[c] = visible ? s_tile[r * LDS + c0 + c] * scale : neg_inf();
            tile_max = fmaxf(tile_max, s[c]);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(FULL_MASK, tile_max, 1));   // the other half of the row
        const float m_new = fmaxf(m, tile_max);
        const float m_safe = (m_new == neg_inf()) ? 0.0f : m_new;   // all-masked guard: no -inf - -inf
        const float alpha = expf(m - m_safe);                      // rescales what earlier tiles summed
        float sum = 0.0f;
#pragma unroll
        for (int c = 0; c < WMMA_TILE; ++c) {
            const float p = expf(s[c] - m_safe);                   // 0 for masked keys
            p_tile[r * LDP + c0 + c] = __float2half(p);
            sum += p;
        }
        l = l * alpha + sum + __shfl_xor_sync(FULL_MASK, sum, 1);
        m = m_new;
        if (lane % 2 == 0) row_scale[r] = alpha;
        __syncwarp();      // P and every row's alpha are in shared memory before any lane reads them

        // 3c. O = alpha O + P V: rescale each element by its row's alpha, then the tile products.
#pragma unroll
        for (int j = 0; j < D_TILES; ++j)
            for (int i = 0; i < acc[j].num_elements; ++i) acc[j].x[i] *= row_scale[int(row_of.x[i])];
        FragP p_frag[K_TILES];
#pragma unroll
        for (int kk = 0; kk < K_TILES; ++kk) wmma::load_matrix_sync(p_frag[kk], p_tile + kk * WMMA_TILE, LDP);
#pragma unroll
        for (int j = 0; j < D_TILES; ++j) {
#pragma unroll
            for (int kk = 0; kk < K_TILES; ++kk) {
                FragV v_frag;
                wmma::load_matrix_sync(v_frag, v_tile + kk * WMMA_TILE * LDH + j * WMMA_TILE, LDH);
                wmma::mma_sync(acc[j], p_frag[kk], v_frag, acc[j]);
            }
        }
    }

    // 4. Normalise once (each element by its row's 1 / l) and write back, two 16-column tiles at a time through
    //    s_tile: lane L writes row L / 2, columns 16 (L % 2) .. of each pair. lse = m + log(l), as flash_prefill.
    if (lane % 2 == 0) row_scale[r] = row_valid ? 1.0f / l : 0.0f;
    __syncwarp();
#pragma unroll
    for (int j = 0; j < D_TILES; ++j)
        for (int i = 0; i < acc[j].num_elements; ++i) acc[j].x[i] *= row_scale[int(row_of.x[i])];
    __half* out_row = out + ((size_t)(b * num_heads + h) * q_len + qi) * D;
    for (int j = 0; j < D_TILES; j += 2) {
        wmma::store_matrix_sync(s_tile, acc[j], LDS, wmma::mem_row_major);
        wmma::store_matrix_sync(s_tile + WMMA_TILE, acc[j + 1], LDS, wmma::mem_row_major);
        __syncwarp();  // both tiles are stored before lanes read whole rows
        if (row_valid)
            for (int c = 0; c < WMMA_TILE; ++c)
                out_row[j * WMMA_TILE + c0 + c] = __float2half(s_tile[r * LDS + c0 + c]);
    }
    if (row_valid && lane % 2 == 0) lse[(size_t)(b * num_heads + h) * q_len + qi] = m + logf(l);
}
