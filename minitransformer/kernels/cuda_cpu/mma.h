// mma.h for the CPU runner: CUDA's warp matrix functions (nvcuda::wmma), 16x16x16 tiles, __half in, float out.
//
// On a GPU a fragment is opaque per-warp storage spread over the 32 lanes' registers; CUDA leaves the mapping of
// matrix elements to lanes unspecified. Here:
// - a matrix_a / matrix_b fragment holds the whole 16x16 tile in every lane (row-major, whatever the layout it was
//   loaded with), so each lane can form any product itself;
// - an accumulator fragment holds 8 elements per lane, as on the hardware: lane L owns elements 8L .. 8L + 7 of the
//   tile in row-major order (row L / 2, columns 8 (L % 2) ..). A kernel that assumes any particular mapping is
//   wrong on a GPU; tests/kernels_planted/wmma_bugs.cu shows what the runner then does.
// mma_sync: each lane computes its own 8 elements of D = A B + C, float32 sums of exact half x half products, so
// the warp does the tile's 16 x 16 x 16 = 4096 multiply-adds once, as the tensor core does (the order of the 16
// terms of a sum is the runner's; the hardware's may differ in the last bit).
//
// Every call is a warp collective, like __syncwarp: all 32 lanes must reach the same call (a divergent call or a
// lane that has returned is a KernelError naming file and line). The rendezvous orders execution, not memory:
// load_matrix_sync reads when its lane arrives and store_matrix_sync writes each lane's part when that lane leaves,
// so data that other lanes wrote to shared memory needs a __syncwarp() (which does order memory) before a load,
// and lanes reading what a store wrote need one after it. A missing __syncwarp shows up as poison or stale data.
// Pointers must be 32-byte aligned and ldm a multiple of 16 bytes, as CUDA requires (checked here).
#pragma once
#include "cuda_fp16.h"
#include "cuda_cpu.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void> class fragment;

template <class T, int Size> struct fragment_storage {
    enum { num_elements = Size };
    T x[Size];
};
// Operands: the whole tile in every lane (element (r, c) at x[16 r + c]).
template <class Layout> class fragment<matrix_a, 16, 16, 16, __half, Layout> : public fragment_storage<__half, 256> {};
template <class Layout> class fragment<matrix_b, 16, 16, 16, __half, Layout> : public fragment_storage<__half, 256> {};
// Accumulator: this lane's 8 elements.
template <> class fragment<accumulator, 16, 16, 16, float> : public fragment_storage<float, 8> {};

}  // namespace wmma
}  // namespace nvcuda

namespace cudacpu {
constexpr int WMMA_TILE = 16;
constexpr int WMMA_PER_LANE = WMMA_TILE * WMMA_TILE / WARP;        // accumulator elements a lane owns

inline unsigned lane_id() { return cur->lin % WARP; }

// The warp's rendezvous of one wmma call; fails unless all 32 lanes take part.
inline void wmma_rendezvous(int op, const char* file, int line) {
    if (g.n % WARP) {
        fail("%s:%d: %s needs whole warps; the block has %u threads", file, line, warp_op_names[op], g.n);
        block_here();
    }
    const unsigned group = unsigned(warp_collective(op, 0xffffffffu, 0, 0, 32, 0, file, line));
    if (group != 0xffffffffu) {
        fail("%s:%d: %s in block (%u,%u,%u) needs all 32 lanes of warp %u; lanes 0x%08x have returned", file, line,
             warp_op_names[op], blockIdx.x, blockIdx.y, blockIdx.z, cur->lin / WARP, ~group);
        block_here();
    }
}

inline void wmma_check_pointer(const void* p, unsigned ldm, size_t element, int op, const char* file, int line) {
    if (reinterpret_cast<uintptr_t>(p) % 32 || (ldm * element) % 16) {
        fail("%s:%d: %s at %p with ldm %u: the pointer must be 32-byte aligned and ldm a multiple of %zu elements",
             file, line, warp_op_names[op], p, ldm, 16 / element);
        block_here();
    }
}

// Element (r, c) of a matrix in memory: row-major at p[r * ldm + c], column-major at p[c * ldm + r].
template <class T> inline T at(const T* p, unsigned ldm, bool row_major, int r, int c) {
    return row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
}
}  // namespace cudacpu

namespace nvcuda {
namespace wmma {

template <class Use, class Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, __half, Layout>& a, const __half* p, unsigned ldm,
                             const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    using namespace cudacpu;
    wmma_check_pointer(p, ldm, sizeof(__half), WMMA_LOAD, file, line);
    for (int r = 0; r < WMMA_TILE; ++r)                      // read on arrival: see the header comment
        for (int c = 0; c < WMMA_TILE; ++c)
            a.x[r * WMMA_TILE + c] = at(p, ldm, std::is_same<Layout, row_major>::value, r, c);
    wmma_rendezvous(WMMA_LOAD, file, line);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& acc, const float* p, unsigned ldm,
                             layout_t layout, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    using namespace cudacpu;
    wmma_check_pointer(p, ldm, sizeof(float), WMMA_LOAD, file, line);
    const int first = int(lane_id()) * WMMA_PER_LANE;
    for (int e = 0; e < WMMA_PER_LANE; ++e)
        acc.x[e] = at(p, ldm, layout == mem_row_major, (first + e) / WMMA_TILE, (first + e) % WMMA_TILE);
    wmma_rendezvous(WMMA_LOAD, file, line);
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& acc, unsigned ldm,
                              layout_t layout, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    using namespace cudacpu;
    wmma_check_pointer(p, ldm, sizeof(float), WMMA_STORE, file, line);
    wmma_rendezvous(WMMA_STORE, file, line);                 // write on leaving: see the header comment
    const int first = int(lane_id()) * WMMA_PER_LANE;
    for (int e = 0; e < WMMA_PER_LANE; ++e) {
        const int r = (first + e) / WMMA_TILE, c = (first + e) % WMMA_TILE;
        (layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r]) = acc.x[e];
    }
}

template <class T> struct same_type { using type = T; };    // fill_fragment(acc, 0) as CUDA's: T not deduced
template <class Use, class T, class Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, typename same_type<T>::type value) {
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = value;
}

// D = A B + C for this lane's 8 elements; A and B are full tiles in every lane.
template <class LayoutA, class LayoutB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                     const fragment<matrix_a, 16, 16, 16, __half, LayoutA>& a,
                     const fragment<matrix_b, 16, 16, 16, __half, LayoutB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c,
                     const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    using namespace cudacpu;
    wmma_rendezvous(WMMA_MMA, file, line);
    const int first = int(lane_id()) * WMMA_PER_LANE;
    float result[WMMA_PER_LANE];
    for (int e = 0; e < WMMA_PER_LANE; ++e) {
        const int r = (first + e) / WMMA_TILE, col = (first + e) % WMMA_TILE;
        float sum = c.x[e];
        for (int k = 0; k < WMMA_TILE; ++k)                  // half x half is exact in float: one rounding per add
            sum += float(a.x[r * WMMA_TILE + k]) * float(b.x[k * WMMA_TILE + col]);
        result[e] = sum;
    }
    for (int e = 0; e < WMMA_PER_LANE; ++e) d.x[e] = result[e];   // d may be c
}

}  // namespace wmma
}  // namespace nvcuda
