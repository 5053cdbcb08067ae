// paged_decode.cu: one decode step of grouped-query attention against a paged KV cache, split-K, built to stream the
// cache at the memory's bandwidth (lesson 11; paged_decode_simple.cu is the plainer version it grew from).
//
// What it computes (the same as gathering each sequence's blocks and calling minitransformer.layers.attention):
//   out[b, h] = softmax_j( q[b, h] . k_j * scale ) @ v,  over the seq_lens[b] tokens of sequence b,
//   where token j of sequence b lives in physical cache block block_tables[b, j / block_size], slot j % block_size.
//   q (B, H, d); k_cache, v_cache (num_blocks, block_size, K, d); block_tables (B, max_blocks) int32;
//   seq_lens (B,) int32; out (B, H, d); lse (B, H). G = H / K query heads share one KV head.
//
// Why it is shaped this way: a decode step reads every cached key and value once and does two multiply-adds per
// element, so its speed is the rate at which it keeps bytes arriving. By Little's law, bytes in flight = bandwidth x
// latency: an H200 moving 4.8 TB/s with loads taking most of a microsecond needs megabytes requested and not yet
// arrived, tens of kilobytes on every SM at every moment. Four things provide them:
//   - 16-byte loads: a lane reads 4 floats or 8 halves with one instruction, a warp 512 bytes;
//   - several tokens' loads issued before any is used: each lane issues DECODE_LOADS independent loads, then reduces;
//   - addressing by block: a warp takes a whole cache block, computes its base address once (64-bit) and walks the
//     slots with a 32-bit stride, instead of a division, a remainder and a 64-bit product per token;
//   - enough blocks: attention.py sizes the partitions from the batch, the KV heads and the GPU's SM count, so the
//     grid (num_partitions, K, B) of DECODE_WARPS-warp blocks fills the machine even at batch 1.
// kernels/sass_report.py checks the first three in the compiled SASS and turns them into a bandwidth estimate.
//
// Kernel 1, paged_decode_partition: grid (num_partitions, K, B), block DECODE_WARPS warps. One block reduces one
//   partition of `partition_size` tokens (a multiple of block_size) of one KV head of one sequence, for the G query
//   heads of that KV head together, so each key and value is read once per step.
//   A token's row of d elements is LANES_PER_TOKEN 16-byte pieces, so a warp reads TOKENS_PER_PASS tokens with one
//   load instruction: lane l reads piece l % LANES_PER_TOKEN of token l / LANES_PER_TOKEN.
//   Phase 1, scores: warp w takes cache blocks w, w + DECODE_WARPS, ... of the partition; per step it loads
//            DECODE_LOADS x TOKENS_PER_PASS keys, then forms the G dot products of each (the query in registers)
//            and finishes them with a shuffle reduction over the token's lanes. Scores go to shared memory.
//   Phase 2, softmax: warp w takes query heads w, w + DECODE_WARPS, ...; max and sum of exp over the partition.
//   Phase 3, weighted sum: the same walk over the values; each lane accumulates p * v for its 4 or 8 dimensions and
//            G heads, then lanes holding the same dimensions add up (shuffles) and the warps add up (shared memory).
//   Writes part_out (B, H, P, d) already divided by its own sum, part_max and part_sum (B, H, P); partitions that
//   start past seq_len do nothing and are never read by the merge.
// Kernel 2, paged_decode_merge (paged_decode_merge.cuh): combines the partitions by log-sum-exp.
//
// Keys and values past seq_len in the last block (whatever they hold, even NaN) are never read: loads past a block's
// valid slots are predicated off, and block table entries past the sequence are never looked up.
#include "common.cuh"
#include "paged_decode_merge.cuh"

constexpr int DECODE_WARPS = 4;          // warps per block
constexpr int DECODE_LOADS = 4;          // 16-byte loads each lane has in flight before it uses the first

// __launch_bounds__: blocks of DECODE_WARPS warps, at least 3 resident per SM. That lets ptxas give a float16 thread
// the ~140 registers its G x 8 accumulators and 4 loads in flight need; asked for 4 blocks it caps them at 128 and
// spills.
template <typename T, int D>
__global__ void __launch_bounds__(DECODE_WARPS * WARP_SIZE, 3)
paged_decode_partition(const T* __restrict__ q,               // (B, H, D)
                       const T* __restrict__ k_cache,         // (num_blocks, block_size, K, D)
                       const T* __restrict__ v_cache,         // (num_blocks, block_size, K, D)
                       const int* __restrict__ block_tables,  // (B, max_blocks)
                       const int* __restrict__ seq_lens,      // (B,)
                       float* __restrict__ part_out,          // (B, H, P, D)
                       float* __restrict__ part_max,          // (B, H, P)
                       float* __restrict__ part_sum,          // (B, H, P)
                       int num_heads, int num_kv_heads, int block_size, int max_blocks,
                       int partition_size, float scale) {
    constexpr int VEC = 16 / sizeof(T);                          // elements per 16-byte load: 4 floats or 8 halves
    constexpr int LANES_PER_TOKEN = D / VEC;                     // 16-byte pieces in one row: 8, 16 or 32
    static_assert(D % VEC == 0 && WARP_SIZE % LANES_PER_TOKEN == 0, "a row must split evenly over a warp's lanes");
    constexpr int TOKENS_PER_PASS = WARP_SIZE / LANES_PER_TOKEN; // tokens one warp-wide load instruction covers
    constexpr int TOKENS_PER_STEP = TOKENS_PER_PASS * DECODE_LOADS;

    const int partition = blockIdx.x;
    const int kv_head = blockIdx.y;
    const int b = blockIdx.z;
    const int num_partitions = gridDim.x;
    const int group = num_heads / num_kv_heads;                  // G <= DECODE_MAX_GROUP (checked by the caller)
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const int piece = lane % LANES_PER_TOKEN;                    // which 16 bytes of a row this lane reads
    const int row = lane / LANES_PER_TOKEN;                      // which of the pass's tokens

    const int seq_len = seq_lens[b];
    const int start = partition * partition_size;                // first token of this partition
    if (start >= seq_len) return;                                // the whole block leaves: no barrier is skipped
    const int n = min(partition_size, seq_len - start);          // tokens in this partition

    extern __shared__ float smem[];
    float* scores = smem;                                        // (G, partition_size): scores, then probabilities
    float* sums = scores + group * partition_size;               // (G,)
    float* partial = sums + group;                               // (DECODE_WARPS, G, D): each warp's output share
    int* blocks = (int*)(partial + DECODE_WARPS * group * D);    // (partition_size / block_size,) physical blocks

    // 0. The physical block of every logical block this partition touches; the group's queries, scaled, in registers.
    const int first_block = start / block_size;                  // start is a multiple of block_size
    const int num_blocks_here = (n + block_size - 1) / block_size;
    for (int i = threadIdx.x; i < num_blocks_here; i += blockDim.x)
        blocks[i] = block_tables[(size_t)b * max_blocks + first_block + i];
    float q_reg[DECODE_MAX_GROUP][VEC];                          // this lane's VEC dimensions of each head's query
    const T* q_group = q + ((size_t)b * num_heads + kv_head * group) * D + piece * VEC;
#pragma unroll
    for (int g = 0; g < DECODE_MAX_GROUP; ++g) {
        if (g < group) unpack16(load16(q_group + g * D), q_reg[g]);
#pragma unroll
        for (int i = 0; i < VEC; ++i) q_reg[g][i] = g < group ? q_reg[g][i] * scale : 0.0f;
    }
    __syncthreads();

    const int slot_stride = num_kv_heads * D;                    // elements from one slot of a block to the next
    // Offset of this lane's piece of slot 0 of logical block lb: one 64-bit product per cache block, not per token.
    auto block_base = [&](int lb) -> size_t {
        return ((size_t)blocks[lb] * block_size * num_kv_heads + kv_head) * D + piece * VEC;
    };

    // 1. Scores. Outer loop: this warp's cache blocks; inner loop: their slots, DECODE_LOADS loads per lane at a time.
    for (int lb = warp; lb < num_blocks_here; lb += DECODE_WARPS) {
        const T* k_block = k_cache + block_base(lb);
        const int valid = min(block_size, n - lb * block_size);  // slots of this block inside the partition
        float* block_scores = scores + lb * block_size;
        for (int s0 = 0; s0 < valid; s0 += TOKENS_PER_STEP) {
            uint4 raw[DECODE_LOADS];                             // all loads issued before any is used
#pragma unroll
            for (int u = 0; u < DECODE_LOADS; ++u) {
                const int slot = s0 + u * TOKENS_PER_PASS + row;
                raw[u] = slot < valid ? load16(k_block + slot * slot_stride) : make_uint4(0u, 0u, 0u, 0u);
            }
            float k[DECODE_LOADS][VEC];
#pragma unroll
            for (int u = 0; u < DECODE_LOADS; ++u) unpack16(raw[u], k[u]);
#pragma unroll
            for (int g = 0; g < DECODE_MAX_GROUP; ++g) {
                if (g < group) {                                 // the same for every lane: the shuffles see all 32
                    float dot[DECODE_LOADS];                     // this lane's share of q_g . k for each token
#pragma unroll
                    for (int u = 0; u < DECODE_LOADS; ++u) {
                        dot[u] = 0.0f;
#pragma unroll
                        for (int i = 0; i < VEC; ++i) dot[u] += q_reg[g][i] * k[u][i];
                    }
                    group_sum<LANES_PER_TOKEN>(dot);             // the token's lanes add up their shares
#pragma unroll
                    for (int u = 0; u < DECODE_LOADS; ++u) {
                        const int slot = s0 + u * TOKENS_PER_PASS + row;
                        if (piece == 0 && slot < valid) block_scores[g * partition_size + slot] = dot[u];
                    }
                }
            }
        }
    }
    __syncthreads();

    // 2. Softmax statistics per query head: max, then exp(score - max) in place and its sum.
    for (int g = warp; g < group; g += DECODE_WARPS) {
        float* scores_g = scores + g * partition_size;
        float mx = neg_inf();
        for (int j = lane; j < n; j += WARP_SIZE) mx = fmaxf(mx, scores_g[j]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int j = lane; j < n; j += WARP_SIZE) {
            const float p = expf(scores_g[j] - mx);
            scores_g[j] = p;
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

    // 3. Weighted sum of values, walked like the keys: acc[g][i] = sum over this lane's tokens of p_g * v[i].
    float acc[DECODE_MAX_GROUP][VEC];
#pragma unroll
    for (int g = 0; g < DECODE_MAX_GROUP; ++g)
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[g][i] = 0.0f;
    for (int lb = warp; lb < num_blocks_here; lb += DECODE_WARPS) {
        const T* v_block = v_cache + block_base(lb);
        const int valid = min(block_size, n - lb * block_size);
        const float* block_probs = scores + lb * block_size;
        for (int s0 = 0; s0 < valid; s0 += TOKENS_PER_STEP) {
            uint4 raw[DECODE_LOADS];
#pragma unroll
            for (int u = 0; u < DECODE_LOADS; ++u) {
                const int slot = s0 + u * TOKENS_PER_PASS + row;
                raw[u] = slot < valid ? load16(v_block + slot * slot_stride) : make_uint4(0u, 0u, 0u, 0u);
            }
            float v[DECODE_LOADS][VEC];
#pragma unroll
            for (int u = 0; u < DECODE_LOADS; ++u) unpack16(raw[u], v[u]);
#pragma unroll
            for (int g = 0; g < DECODE_MAX_GROUP; ++g) {
                if (g < group) {                                 // every head uses all DECODE_LOADS values
#pragma unroll
                    for (int u = 0; u < DECODE_LOADS; ++u) {
                        const int slot = s0 + u * TOKENS_PER_PASS + row;   // past `valid`: no probability written
                        const float p = slot < valid ? block_probs[g * partition_size + slot] : 0.0f;
#pragma unroll
                        for (int i = 0; i < VEC; ++i) acc[g][i] += p * v[u][i];
                    }
                }
            }
        }
    }
    // Lanes reading the same piece of different tokens add up (offsets LANES_PER_TOKEN, 2 x, ... < 32: lanes of the
    // same piece); the warp's first row writes its share.
#pragma unroll
    for (int g = 0; g < DECODE_MAX_GROUP; ++g) {
        if (g < group) {
#pragma unroll
            for (int offset = LANES_PER_TOKEN; offset < WARP_SIZE; offset *= 2)
#pragma unroll
                for (int i = 0; i < VEC; ++i) acc[g][i] += __shfl_xor_sync(FULL_MASK, acc[g][i], offset);
#pragma unroll
            for (int i = 0; i < VEC; ++i)
                if (row == 0) partial[(warp * group + g) * D + piece * VEC + i] = acc[g][i];
        }
    }
    __syncthreads();

    // The warps' shares added, divided by the partition's softmax sum.
    for (int idx = threadIdx.x; idx < group * D; idx += blockDim.x) {
        const int g = idx / D, c = idx % D;
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < DECODE_WARPS; ++w) total += partial[(w * group + g) * D + c];
        const size_t out_row = ((size_t)b * num_heads + kv_head * group + g) * num_partitions + partition;
        part_out[out_row * D + c] = total / sums[g];
    }
}
