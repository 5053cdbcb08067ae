// Planted bug: 64 KiB of static shared memory, over the 48 KiB a block may have without opting in (and static
// shared memory cannot opt in at all).
extern "C" __global__ void too_big(float* out) {
    __shared__ float big[16384];
    big[threadIdx.x] = float(threadIdx.x);
    __syncthreads();
    out[threadIdx.x] = big[(threadIdx.x + 1) % blockDim.x];
}
