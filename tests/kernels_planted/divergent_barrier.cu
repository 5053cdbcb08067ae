// Planted bugs: __syncthreads reached by only part of the block. CUDA leaves this undefined (a hang, or threads
// silently passing different barriers); the CPU runner raises KernelError naming the file and line.

// Even and odd threads wait at two different barriers.
extern "C" __global__ void two_barriers(float* data) {
    __shared__ float tile[64];
    const int t = threadIdx.x;
    tile[t] = data[t];
    if (t % 2 == 0) {
        __syncthreads();  // BUG: even threads wait here
        data[t] = tile[t ^ 1];
    } else {
        __syncthreads();  // BUG: odd threads wait here
        data[t] = -tile[t ^ 1];
    }
}

// The classic bounds check before a barrier: threads past n return while the others wait.
extern "C" __global__ void early_return(const float* x, float* out, int n) {
    __shared__ float tile[64];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;  // BUG: these threads never reach the barrier below
    tile[threadIdx.x] = x[i];
    __syncthreads();  // BUG: the barrier the returned threads skip
    out[i] = tile[(threadIdx.x + 1) % blockDim.x];
}

// Half a warp shuffles while the other half has gone on to a block barrier.
extern "C" __global__ void half_warp_shuffle(float* data) {
    float v = data[threadIdx.x];
    if (threadIdx.x % 32 < 16)
        v += __shfl_xor_sync(0xffffffffu, v, 1);  // BUG: lanes 16-31 of the mask never come here
    __syncthreads();
    data[threadIdx.x] = v;
}
