// The scheduler of the CPU runner: the threads of one block as fibers (or OS threads), run one at a time.
//
// Only one emulated CUDA thread runs at any moment. It runs until it blocks -- at __syncthreads, at a warp collective
// (__shfl_*_sync, __syncwarp, __ballot_sync, mma.h's wmma functions) -- or until it returns. When no thread can run,
// the scheduler completes what can be completed (a warp collective all of whose lanes arrived, then a barrier all
// threads reached at the same line) and otherwise reports, with file and line, why the block is stuck: a divergent
// barrier, threads exiting while others wait, a shuffle some lane never reaches, a shuffle reading a lane that has
// returned. Because threads never run concurrently, plain read-modify-write is atomic and no emulated memory access
// races with another.
//
// The order in which the runnable threads are resumed (after each barrier and each round of warp collectives) is
// chosen per launch: forward (0, 1, ..., n-1), reverse, or shuffled afresh every round from a seed. Each order is one
// interleaving a GPU may also produce, since a GPU too orders the stretches of code between two sync points of
// different threads as it likes. A kernel that needs a __syncthreads it lacks reads another thread's shared memory
// too early (poison: NaN) or too late (already overwritten) only under the orders that put the writer on the
// wrong side of the reader; running a kernel under several orders is what makes such a bug visible.
//
// fibers (default): ucontext makecontext/swapcontext starts each fiber on a stack allocated once and reused for
// every block; later switches use _setjmp/_longjmp, which do not save the signal mask (swapcontext makes a system
// call for it on every switch: about 20x slower per barrier here).
// threads: one OS thread per CUDA thread, passing a baton (a semaphore each), so the order and the rules are the same
// as with fibers: a cross-check of the fiber machinery with real stacks, about 100x slower per switch.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdarg>
#include <new>
#include <pthread.h>
#include <setjmp.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/mman.h>
#include <type_traits>
#include <ucontext.h>
#include <unistd.h>
#include <utility>

struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return {x, y, z}; }
};

namespace cudacpu {

template <class T> struct half_kind { static constexpr int value = 0; };  // specialised by cuda_fp16.h / cuda_bf16.h

enum State { READY, AT_BARRIER, AT_WARP, DONE };
enum WarpOp { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR, SYNCWARP, BALLOT, WMMA_LOAD, WMMA_STORE, WMMA_MMA };
static const char* const warp_op_names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                            "__shfl_xor_sync", "__syncwarp", "__ballot_sync",
                                            "wmma::load_matrix_sync", "wmma::store_matrix_sync", "wmma::mma_sync"};
inline bool exchanges_values(int op) { return op <= SHFL_XOR; }    // the shuffles; the rest only meet (mma.h)
static const int WARP = 32;
static const size_t MAX_DYNAMIC_SHARED = 227 * 1024;      // sm_90's largest opt-in shared memory per block

struct Fiber {
    uint3 tid;
    unsigned lin;               // x + y * Dx + z * Dx * Dy: lane = lin % 32, warp = lin / 32
    State state;
    bool started;
    const char* file;           // where it blocked
    int line;
    int pred;                   // barrier / ballot predicate
    int op, arg, width;         // pending warp collective
    unsigned mask;
    uint64_t value, result;     // the bits offered to / received from a shuffle
    ucontext_t ctx;             // fibers mode: the context the fiber starts in
    jmp_buf where;              // fibers mode: where it blocked
    char* stack;
    size_t stack_size;
    sem_t sem;                  // threads mode: this thread may run
    pthread_t thread;
};

// What Python passes to cudacpu_launch (ctypes mirror in cpu_runner.py: keep the two in step).
struct LaunchConfig {
    uint32_t grid[3], block[3];
    uint64_t dynamic_shared;    // bytes of extern __shared__ memory
    uint64_t stack_size;        // bytes per emulated thread
    int32_t mode;               // 0 fibers, 1 threads
    int32_t n_poison;           // static __shared__ objects to poison before each block: (address, bytes) pairs
    const uint64_t* poison;
    char* error;                // out: "file:line: what went wrong"
    int32_t error_len;
    int32_t order;              // resume order: 0 forward, 1 reverse, 2 shuffled every round (from seed)
    uint64_t seed;
};

struct Global {
    dim3 gridDim, blockDim;
    uint3 blockIdx;
    Fiber* fibers = nullptr;
    unsigned n = 0, capacity = 0, n_done = 0;
    int mode = 0;
    ucontext_t scheduler;
    jmp_buf scheduler_where;
    sem_t scheduler_sem;
    bool failed = false, abort = false, quit = false;
    bool in_fiber = false;                                  // fibers mode: an emulated thread is running now
    struct sigaction previous_segv, previous_bus;
    char error[1024];
    void (*thunk)(void*, void**) = nullptr;   // calls the kernel with its unpacked arguments
    void* kernel = nullptr;
    void** args = nullptr;
    int order = 0;
    uint64_t rng = 0;                                       // order 2: splitmix64 state, from the launch's seed
    unsigned schedule[1024];                                // the resume order of the current round
};
static Global g;
static thread_local Fiber* cur = nullptr;                  // the emulated thread running on this OS thread
alignas(128) static unsigned char dynamic_shared[MAX_DYNAMIC_SHARED];
struct Abort {};                                            // unwinds a blocked OS thread when the block failed

static void fail(const char* fmt, ...) {
    if (g.failed) return;                                   // keep the first problem: later ones follow from it
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g.error, sizeof g.error, fmt, ap);
    va_end(ap);
    g.failed = true;
}

// ---- switching between the scheduler and an emulated thread ---------------------------------------------------

static void run_kernel_then_finish() {
    g.thunk(g.kernel, g.args);
    cur->state = DONE;
    ++g.n_done;
}

static void fiber_main() {
    run_kernel_then_finish();
    _longjmp(g.scheduler_where, 1);                         // never resumed: the next block starts from f.ctx again
}

static void* thread_main(void* p) {
    cur = static_cast<Fiber*>(p);
    for (;;) {
        sem_wait(&cur->sem);                                // the scheduler starts this thread on a new block
        if (g.quit) return nullptr;
        try {
            run_kernel_then_finish();
        } catch (Abort&) {
            cur->state = DONE;
            ++g.n_done;
        }
        sem_post(&g.scheduler_sem);
    }
}

// Called by an emulated thread that has recorded why it blocks: give control back until the scheduler resumes it.
static void block_here() {
    if (g.mode == 0) {
        if (_setjmp(cur->where) == 0) _longjmp(g.scheduler_where, 1);
    } else {
        sem_post(&g.scheduler_sem);
        sem_wait(&cur->sem);
        if (g.abort) throw Abort{};
    }
}

static void resume(Fiber& f) {
    if (g.mode == 0) {
        cur = &f;
        g.in_fiber = true;
        if (_setjmp(g.scheduler_where) == 0) {
            if (f.started) _longjmp(f.where, 1);
            f.started = true;
            swapcontext(&g.scheduler, &f.ctx);              // enter fiber_main; f.ctx is only read, so it can
                                                            // start every block (g.scheduler is never resumed)
        }
        g.in_fiber = false;
    } else {
        f.started = true;
        sem_post(&f.sem);
        sem_wait(&g.scheduler_sem);
    }
}

// ---- completing collectives ------------------------------------------------------------------------------------

static unsigned alive_lanes(unsigned warp) {                // lanes that exist and have not returned
    unsigned mask = 0;
    for (unsigned lane = 0; lane < WARP && warp * WARP + lane < g.n; ++lane)
        if (g.fibers[warp * WARP + lane].state != DONE) mask |= 1u << lane;
    return mask;
}

static unsigned source_lane(const Fiber& f, unsigned lane) { // CUDA's rules, width a power of two <= 32
    const unsigned w = unsigned(f.width), seg = lane & ~(w - 1), d = unsigned(f.arg);
    switch (f.op) {
        case SHFL_IDX: return seg + (d & (w - 1));
        case SHFL_UP: return lane - seg < d ? lane : lane - d;
        case SHFL_DOWN: return lane - seg + d >= w ? lane : lane + d;
        case SHFL_XOR: { unsigned s = lane ^ d; return s >= seg + w ? lane : s; }
    }
    return lane;
}

static void describe_thread(const Fiber& f, char* out, size_t len) {
    snprintf(out, len, "thread (%u,%u,%u)", f.tid.x, f.tid.y, f.tid.z);
}

// Complete every warp collective whose lanes (those named in the mask that still run) have all arrived at the same
// kind of collective with the same mask: as in CUDA, lanes of the mask that have returned are not waited for. A
// shuffle that reads such a lane is an error (CUDA: the value is undefined); a source lane that is alive but not
// in the mask, or that does not exist (a partial last warp), yields poison (all bits set: NaN, -1).
static bool complete_warp_collectives() {
    bool progressed = false;
    for (unsigned warp = 0; warp * WARP < g.n; ++warp) {
        const unsigned alive = alive_lanes(warp);
        unsigned exited = 0;                                // lanes that exist and have returned
        for (unsigned lane = 0; lane < WARP && warp * WARP + lane < g.n; ++lane)
            if (!(alive & (1u << lane))) exited |= 1u << lane;
        Fiber* lanes = g.fibers + warp * WARP;
        for (unsigned lane = 0; lane < WARP && warp * WARP + lane < g.n; ++lane) {
            const Fiber& f = lanes[lane];
            if (f.state != AT_WARP) continue;
            if (!(f.mask & (1u << lane))) {
                fail("%s:%d: %s with mask 0x%08x called by lane %u, which the mask does not name", f.file, f.line,
                     warp_op_names[f.op], f.mask, lane);
                return false;
            }
            const unsigned group = f.mask & alive;
            bool complete = true;
            for (unsigned j = 0; j < WARP && complete; ++j)
                if (group & (1u << j))
                    complete = lanes[j].state == AT_WARP && lanes[j].mask == f.mask && lanes[j].op == f.op;
            if (!complete) continue;
            for (unsigned j = 0; j < WARP && exchanges_values(f.op); ++j) {
                const unsigned src = (group & (1u << j)) ? source_lane(lanes[j], j) : WARP;
                if (src >= WARP || !(exited & (1u << src))) continue;
                char a[64], b[64];
                describe_thread(lanes[j], a, sizeof a);
                describe_thread(lanes[src], b, sizeof b);
                fail("%s:%d: %s (mask 0x%08x) in block (%u,%u,%u): lane %u, %s, reads lane %u, %s, which has "
                     "already returned (a shuffle may read only lanes that take part in it)", f.file, f.line,
                     warp_op_names[f.op], f.mask, g.blockIdx.x, g.blockIdx.y, g.blockIdx.z, j, a, src, b);
                return false;
            }
            unsigned ballot = 0;
            for (unsigned j = 0; j < WARP; ++j)
                if ((group & (1u << j)) && lanes[j].pred) ballot |= 1u << j;
            for (unsigned j = 0; j < WARP; ++j) {
                if (!(group & (1u << j))) continue;
                Fiber& t = lanes[j];
                if (t.op == BALLOT) {
                    t.result = uint64_t(ballot) | (uint64_t(group) << 32);
                } else if (exchanges_values(t.op)) {
                    const unsigned src = source_lane(t, j);
                    t.result = src < WARP && (group & (1u << src)) ? lanes[src].value : ~uint64_t(0);
                } else {
                    t.result = group;                       // __syncwarp, wmma: the lanes that took part
                }
                t.state = READY;
            }
            progressed = true;
        }
    }
    return progressed;
}

// All threads that have not returned wait at __syncthreads: release them if it is the same barrier for all.
static bool release_barrier() {
    const Fiber* first = nullptr;
    const Fiber* exited = nullptr;
    for (unsigned i = 0; i < g.n; ++i) {
        const Fiber& f = g.fibers[i];
        if (f.state == READY || f.state == AT_WARP) return false;
        if (f.state == DONE && !exited) exited = &f;
        if (f.state == AT_BARRIER && !first) first = &f;
    }
    if (!first) return false;
    char a[64], b[64];
    describe_thread(*first, a, sizeof a);
    if (exited) {
        describe_thread(*exited, b, sizeof b);
        fail("%s:%d: __syncthreads in block (%u,%u,%u): %s waits here but %s has already returned "
             "(a barrier must be reached by every thread of the block)", first->file, first->line,
             g.blockIdx.x, g.blockIdx.y, g.blockIdx.z, a, b);
        return false;
    }
    int count = 0;
    for (unsigned i = 0; i < g.n; ++i) {
        const Fiber& f = g.fibers[i];
        if (f.line != first->line || strcmp(f.file, first->file) != 0) {
            describe_thread(f, b, sizeof b);
            fail("%s:%d: divergent __syncthreads in block (%u,%u,%u): %s waits at %s:%d but %s waits at %s:%d",
                 first->file, first->line, g.blockIdx.x, g.blockIdx.y, g.blockIdx.z, a, first->file, first->line,
                 b, f.file, f.line);
            return false;
        }
        count += f.pred != 0;
    }
    for (unsigned i = 0; i < g.n; ++i) {
        g.fibers[i].result = uint64_t(count);
        g.fibers[i].state = READY;
    }
    return true;
}

// Nothing can run and nothing can complete: name a warp collective and the lane that keeps it from completing.
static void report_stuck() {
    for (unsigned i = 0; i < g.n; ++i) {
        const Fiber& f = g.fibers[i];
        if (f.state != AT_WARP) continue;
        const unsigned warp = i / WARP, group = f.mask & alive_lanes(warp);
        for (unsigned j = 0; j < WARP; ++j) {
            const Fiber& t = g.fibers[warp * WARP + j];
            if (!(group & (1u << j)) || (t.state == AT_WARP && t.mask == f.mask && t.op == f.op)) continue;
            char a[64], where[200];
            describe_thread(t, a, sizeof a);
            if (t.state == AT_BARRIER)
                snprintf(where, sizeof where, "waits at __syncthreads %s:%d", t.file, t.line);
            else
                snprintf(where, sizeof where, "waits at %s (mask 0x%08x) %s:%d", warp_op_names[t.op], t.mask,
                         t.file, t.line);
            fail("%s:%d: %s (mask 0x%08x) in block (%u,%u,%u) is not reached by lane %u, %s, which %s",
                 f.file, f.line, warp_op_names[f.op], f.mask, g.blockIdx.x, g.blockIdx.y, g.blockIdx.z, j, a, where);
            return;
        }
    }
    fail("deadlock in block (%u,%u,%u): no thread can run", g.blockIdx.x, g.blockIdx.y, g.blockIdx.z);
}

static uint64_t next_random() {                             // splitmix64 (Steele, Lea, Flood 2014)
    uint64_t z = (g.rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The order of the next round: every runnable thread is resumed once, in this order, and runs until it blocks.
static void plan_round() {
    for (unsigned k = 0; k < g.n; ++k) g.schedule[k] = g.order == 1 ? g.n - 1 - k : k;
    if (g.order == 2)
        for (unsigned k = g.n - 1; k > 0; --k)              // Fisher-Yates
            std::swap(g.schedule[k], g.schedule[next_random() % (k + 1)]);
}

static bool run_block() {
    for (unsigned i = 0; i < g.n; ++i) {
        g.fibers[i].state = READY;
        g.fibers[i].started = false;
    }
    g.n_done = 0;
    for (;;) {
        plan_round();
        for (unsigned k = 0; k < g.n; ++k) {
            Fiber& f = g.fibers[g.schedule[k]];
            if (f.state != READY) continue;
            resume(f);
            if (g.failed) return false;
        }
        if (g.n_done == g.n) return true;
        if (complete_warp_collectives()) continue;
        if (g.failed) return false;
        if (release_barrier()) continue;
        if (!g.failed) report_stuck();
        return false;
    }
}

// ---- a memory fault in an emulated thread: a KernelError, not a dead Python (fibers mode) ------------------------
// The handler runs on its own stack (the fiber's may be the thing that overflowed), names the thread and jumps back
// to the scheduler, abandoning the fiber. A fault anywhere else goes to the handler that was there before.

alignas(16) static char signal_stack[64 * 1024];

static void on_fault(int sig, siginfo_t* info, void*) {
    if (g.mode != 0 || !g.in_fiber || !cur) {
        sigaction(sig, sig == SIGSEGV ? &g.previous_segv : &g.previous_bus, nullptr);
        return;                                             // the instruction faults again, into the old handler
    }
    const Fiber& f = *cur;
    const char* address = static_cast<const char*>(info->si_addr);
    if (address >= f.stack - sysconf(_SC_PAGESIZE) && address < f.stack)
        fail("stack overflow in thread (%u,%u,%u) of block (%u,%u,%u): its locals need more than %zu bytes "
             "(set the kernel's stack_size)", f.tid.x, f.tid.y, f.tid.z, g.blockIdx.x, g.blockIdx.y, g.blockIdx.z,
             f.stack_size);
    else
        fail("illegal memory access at %p in thread (%u,%u,%u) of block (%u,%u,%u): an index out of bounds?",
             info->si_addr, f.tid.x, f.tid.y, f.tid.z, g.blockIdx.x, g.blockIdx.y, g.blockIdx.z);
    sigset_t unblock;                                       // _longjmp leaves the signal blocked: unblock it first
    sigemptyset(&unblock);
    sigaddset(&unblock, sig);
    pthread_sigmask(SIG_UNBLOCK, &unblock, nullptr);
    _longjmp(g.scheduler_where, 1);
}

struct FaultGuard {                                         // installed for the duration of one fibers launch
    stack_t previous_stack;
    explicit FaultGuard() {
        stack_t alternate{};
        alternate.ss_sp = signal_stack;
        alternate.ss_size = sizeof signal_stack;
        sigaltstack(&alternate, &previous_stack);
        struct sigaction action{};
        action.sa_sigaction = on_fault;
        action.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&action.sa_mask);
        sigaction(SIGSEGV, &action, &g.previous_segv);
        sigaction(SIGBUS, &action, &g.previous_bus);
    }
    ~FaultGuard() {
        sigaction(SIGSEGV, &g.previous_segv, nullptr);
        sigaction(SIGBUS, &g.previous_bus, nullptr);
        sigaltstack(&previous_stack, nullptr);
    }
};

// ---- a launch: every block of the grid, one after another ------------------------------------------------------

static bool prepare_fibers(const LaunchConfig& c) {
    if (g.capacity < g.n) {                                 // grow once; stacks are kept for later launches
        Fiber* more = static_cast<Fiber*>(calloc(g.n, sizeof(Fiber)));
        if (!more) return false;
        if (g.fibers) memcpy(more, g.fibers, g.capacity * sizeof(Fiber));
        free(g.fibers);
        g.fibers = more;
        g.capacity = g.n;
    }
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    for (unsigned i = 0; i < g.n; ++i) {
        Fiber& f = g.fibers[i];
        f.lin = i;
        f.tid = {i % g.blockDim.x, (i / g.blockDim.x) % g.blockDim.y, i / (g.blockDim.x * g.blockDim.y)};
        if (c.mode == 0 && f.stack_size != c.stack_size) {  // a guard page below each stack: overflow faults
            if (f.stack) munmap(f.stack - page, f.stack_size + page);
            char* base = static_cast<char*>(mmap(nullptr, c.stack_size + page, PROT_READ | PROT_WRITE,
                                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0));
            if (base == MAP_FAILED) return false;
            mprotect(base, page, PROT_NONE);
            f.stack = base + page;
            f.stack_size = c.stack_size;
        }
        if (c.mode == 0) {                                  // per launch: the array of fibers may have moved
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack;
            f.ctx.uc_stack.ss_size = f.stack_size;
            f.ctx.uc_link = nullptr;
            makecontext(&f.ctx, fiber_main, 0);
        }
    }
    return true;
}

static int launch(const LaunchConfig& c, void (*thunk)(void*, void**), void* kernel, void** args) {
    Fiber* const fibers = g.fibers;                         // keep the fibers (and their stacks), reset the rest
    const unsigned capacity = g.capacity;
    g = Global();
    g.fibers = fibers;
    g.capacity = capacity;
    g.gridDim = dim3(c.grid[0], c.grid[1], c.grid[2]);
    g.blockDim = dim3(c.block[0], c.block[1], c.block[2]);
    g.n = c.block[0] * c.block[1] * c.block[2];
    g.mode = c.mode;
    g.order = c.order;
    g.rng = c.seed;
    g.thunk = thunk;
    g.kernel = kernel;
    g.args = args;
    if (c.dynamic_shared > MAX_DYNAMIC_SHARED || g.n > sizeof g.schedule / sizeof g.schedule[0] || c.order < 0 ||
        c.order > 2 || !prepare_fibers(c)) {
        snprintf(c.error, size_t(c.error_len), "cannot set up the launch (shared memory, threads, order or stacks)");
        return 1;
    }
    sem_init(&g.scheduler_sem, 0, 0);
    unsigned created = 0;                                   // threads mode: OS threads for this launch
    if (g.mode == 1) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, c.stack_size);
        for (; created < g.n; ++created) {
            sem_init(&g.fibers[created].sem, 0, 0);
            if (pthread_create(&g.fibers[created].thread, &attr, thread_main, &g.fibers[created]) != 0) {
                sem_destroy(&g.fibers[created].sem);
                fail("cannot create OS thread %u of %u for mode=\"threads\"; use mode=\"fibers\"", created, g.n);
                break;
            }
        }
        pthread_attr_destroy(&attr);
    }
    FaultGuard* guard = g.mode == 0 ? new FaultGuard() : nullptr;
    for (unsigned z = 0; z < c.grid[2] && !g.failed; ++z)
        for (unsigned y = 0; y < c.grid[1] && !g.failed; ++y)
            for (unsigned x = 0; x < c.grid[0] && !g.failed; ++x) {
                g.blockIdx = {x, y, z};
                // Poison: a read of shared memory before any thread wrote it gives NaN (floats) or -1 (ints).
                memset(dynamic_shared, 0xff, sizeof dynamic_shared);
                for (int k = 0; k < c.n_poison; ++k)
                    memset(reinterpret_cast<void*>(c.poison[2 * k]), 0xff, size_t(c.poison[2 * k + 1]));
                if (run_block()) continue;
                if (g.mode == 1) {                          // unwind the OS threads still blocked mid-kernel
                    g.abort = true;
                    for (unsigned i = 0; i < g.n; ++i)
                        if (g.fibers[i].started && g.fibers[i].state != DONE) resume(g.fibers[i]);
                    g.abort = false;
                }
            }
    delete guard;
    if (g.mode == 1) {
        g.quit = true;
        for (unsigned i = 0; i < created; ++i) sem_post(&g.fibers[i].sem);
        for (unsigned i = 0; i < created; ++i) {
            pthread_join(g.fibers[i].thread, nullptr);
            sem_destroy(&g.fibers[i].sem);
        }
    }
    sem_destroy(&g.scheduler_sem);
    cur = nullptr;
    if (!g.failed) return 0;
    snprintf(c.error, size_t(c.error_len), "%s", g.error);
    return 1;
}

}  // namespace cudacpu
