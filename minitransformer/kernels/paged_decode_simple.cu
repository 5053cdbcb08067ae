// paged_decode_simple.cu: the teaching baseline of paged decode (lesson 11): one token per warp, scalar loads.
//
// paged_decode.cu is the same computation built for memory bandwidth; this file keeps the first, plainer version so
// the two can be compared (kernels/sass_report.py statically, scripts/gpu_check_kernels.py on a GPU). Both write the
// same partials and share the merge kernel of paged_decode_merge.cuh.
//
// What it computes (the same as gathering each sequence's blocks and calling minitransformer.layers.attention):
//   out[b, h] = softmax_j( q[b, h] . k_j * scale ) @ v,  over the seq_lens[b] tokens of sequence b,
//   where token j of sequence b lives in physical cache block block_tables[b, j / block_size], slot j % block_size.
//   q (B, H, d); k_cache, v_cache (num_blocks, block_size, K, d); block_tables (B, max_blocks) int32;
//   seq_lens (B,) int32; out (B, H, d); lse (B, H). G = H / K query heads share one KV head.
//
// Why split-K: a decode step has one query per sequence, so one block per (sequence, head) leaves most of the GPU
// idle when the batch is small and the context long. Cutting each sequence into partitions of `partition_size`
// tokens gives (partitions x K x B) independent blocks; each reduces its partition to a partial output, its max
// and its sum, and a second kernel merges the partitions by their log-sum-exp. This is flash-decoding (Tri Dao,
// Daniel Haziza, Francisco Massa, Grigory Sizov, "Flash-Decoding for long-context inference", 2023) and the shape of
// vLLM's PagedAttention v2 (Kwon et al., "Efficient Memory Management for Large Language Model Serving with
// PagedAttention", SOSP 2023), written afresh here.
//
// Kernel 1, paged_decode_simple_partition:
//   grid  = (num_partitions, K, B): one block per partition of one KV head of one sequence. The block handles the
//           G query heads of that KV head together, so each key and value of the cache is read once per step.
//   block = d threads (2 warps for d = 64, 4 for d = 128).
//   Phase 1, scores: warp w takes tokens w, w + warps, ...; its 32 lanes split the d dimensions of the token's key
//            (coalesced reads), and a warp reduction finishes each of the G dot products. Scores go to shared memory.
//   Phase 2, softmax: warp w takes query heads w, w + warps, ...; max and sum of exp over the partition.
//   Phase 3, weighted sum: thread c owns dimension c of all G outputs and walks the partition's values
//            (consecutive threads read consecutive values: coalesced).
//   Writes part_out (B, H, P, d) already divided by its own sum, part_max and part_sum (B, H, P).
//   partition_size is a multiple of block_size, so a partition starts on a block boundary and looks up only its own
//   partition_size / block_size entries of the block table (kept in shared memory).
//   Partitions that start past seq_len do nothing and are never read by the merge.
// Kernel 2, paged_decode_merge (paged_decode_merge.cuh):
//   grid = (H, B), block = d threads: with M = max_p part_max and w_p = part_sum_p * exp(part_max_p - M),
//   out = sum_p w_p part_out_p / sum_p w_p and lse = M + log(sum_p w_p).
//
// Keys and values past seq_len in the last block (whatever they hold, even NaN) are never read: every loop stops at
// the sequence's own length, and block table entries past it are never looked up.
#include "common.cuh"
#include "paged_decode_merge.cuh"

template <typename T, int D>
__global__ void
paged_decode_simple_partition(const T* __restrict__ q,               // (B, H, D)
                       const T* __restrict__ k_cache,         // (num_blocks, block_size, K, D)
                       const T* __restrict__ v_cache,         // (num_blocks, block_size, K, D)
                       const int* __restrict__ block_tables,  // (B, max_blocks)
                       const int* __restrict__ seq_lens,      // (B,)
                       float* __restrict__ part_out,          // (B, H, P, D)
                       float* __restrict__ part_max,          // (B, H, P)
                       float* __restrict__ part_sum,          // (B, H, P)
                       int num_heads, int num_kv_heads, int block_size, int max_blocks,
                       int partition_size, float scale) {
    static_assert(D % WARP_SIZE == 0, "head_dim must be a multiple of 32");
    constexpr int DIMS_PER_LANE = D / WARP_SIZE;
    constexpr int NUM_WARPS = D / WARP_SIZE;                     // blockDim.x == D

    const int partition = blockIdx.x;
    const int kv_head = blockIdx.y;
    const int b = blockIdx.z;
    const int num_partitions = gridDim.x;
    const int group = num_heads / num_kv_heads;                  // G <= DECODE_MAX_GROUP (checked by the caller)
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;

    const int seq_len = seq_lens[b];
    const int start = partition * partition_size;                // first token of this partition
    if (start >= seq_len) return;                                // the whole block leaves: no barrier is skipped
    const int n = min(partition_size, seq_len - start);          // tokens in this partition

    extern __shared__ float smem[];
    float* q_s = smem;                                           // (G, D)
    float* scores = q_s + group * D;                             // (G, partition_size): scores, then probabilities
    float* sums = scores + group * partition_size;               // (G,)
    int* blocks = (int*)(sums + group);                          // (partition_size / block_size,) physical blocks

    // 0. The group's queries, and the physical block of every logical block this partition touches.
    for (int i = threadIdx.x; i < group * D; i += blockDim.x)
        q_s[i] = to_float(q[((size_t)b * num_heads + kv_head * group) * D + i]);
    const int first_block = start / block_size;                  // start is a multiple of block_size
    const int num_blocks_here = (n + block_size - 1) / block_size;
    for (int i = threadIdx.x; i < num_blocks_here; i += blockDim.x)
        blocks[i] = block_tables[(size_t)b * max_blocks + first_block + i];
    __syncthreads();

    // Offset of token j (0-based inside the partition) of this KV head in the cache.
    auto token_offset = [&](int j) -> size_t {
        const int physical = blocks[j / block_size];
        const int slot = j % block_size;
        return (((size_t)physical * block_size + slot) * num_kv_heads + kv_head) * D;
    };

    // 1. Scores: one warp per token, lanes split the dimensions; G dot products per key. (Unrolling lets a warp
    //    have the loads of several tokens in flight at once: decode is limited by memory, not arithmetic.)
#pragma unroll 4
    for (int j = warp; j < n; j += NUM_WARPS) {
        const T* k_row = k_cache + token_offset(j);
        float k_reg[DIMS_PER_LANE];
#pragma unroll
        for (int i = 0; i < DIMS_PER_LANE; ++i) k_reg[i] = to_float(k_row[lane + i * WARP_SIZE]);
        for (int g = 0; g < group; ++g) {
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < DIMS_PER_LANE; ++i) dot += q_s[g * D + lane + i * WARP_SIZE] * k_reg[i];
            dot = warp_sum(dot);
            if (lane == 0) scores[g * partition_size + j] = dot * scale;
        }
    }
    __syncthreads();

    // 2. Softmax statistics per query head: max, then exp(score - max) in place and its sum.
    for (int g = warp; g < group; g += NUM_WARPS) {
        float* row = scores + g * partition_size;
        float mx = neg_inf();
        for (int j = lane; j < n; j += WARP_SIZE) mx = fmaxf(mx, row[j]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int j = lane; j < n; j += WARP_SIZE) {
            const float p = expf(row[j] - mx);
            row[j] = p;
            sum += p;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            const size_t stat = ((size_t)b * num_heads + kv_head * group + g) * num_partitions + partition;
            part_max[stat] = mx;
            part_sum[stat] = sum;
            sums[g] = sum;
        }
    }
    __syncthreads();

    // 3. Weighted sum of values: thread c accumulates dimension c for all G heads (registers, unrolled).
    const int c = threadIdx.x;
    float acc[DECODE_MAX_GROUP];
#pragma unroll
    for (int g = 0; g < DECODE_MAX_GROUP; ++g) acc[g] = 0.0f;
#pragma unroll 8
    for (int j = 0; j < n; ++j) {
        const float v_jc = to_float(v_cache[token_offset(j) + c]);
#pragma unroll
        for (int g = 0; g < DECODE_MAX_GROUP; ++g)
            if (g < group) acc[g] += scores[g * partition_size + j] * v_jc;
    }
#pragma unroll
    for (int g = 0; g < DECODE_MAX_GROUP; ++g) {
        if (g < group) {
            const size_t row = ((size_t)b * num_heads + kv_head * group + g) * num_partitions + partition;
            part_out[row * D + c] = acc[g] / sums[g];
        }
    }
}
