/* A small thread pool for large calls, built so that a helper that is slow to wake never
 * delays a call: the calling thread claims chunks itself from a shared counter, helpers claim
 * what is left, and the call returns once every *claimed* chunk is done.  (OpenMP's barrier
 * waits for every thread of the team to arrive; on a loaded 2-core machine that cost 25 ms per
 * call.)  The claim counter carries the job's generation in its high 32 bits, so a helper still
 * holding an old job can never claim a chunk of the next one.  Helpers sleep on a condition
 * variable between jobs (no spinning).  Calls from several threads at once: the first one uses
 * the pool, the others run on their own thread.  A job carries its caller's floating-point mode
 * (flush-to-zero, denormals-are-zero, rounding; e.g. torch.set_flush_denormal(True)), and the
 * helpers compute it in that mode: no result depends on which thread computed its chunk. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ma_native.h"

#define MAX_HELPERS 63

/* The mode bits a job carries: x86 MXCSR FTZ (15), rounding (13-14), DAZ (6); aarch64 FPCR
 * FZ (24), rounding (22-23), FZ16 (19). */
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define FP_MODE_BITS 0xe040u
static unsigned fp_mode_get(void) { return _mm_getcsr(); }
static void fp_mode_set(unsigned m) { _mm_setcsr(m); }
#elif defined(__aarch64__)
#define FP_MODE_BITS ((1u << 24) | (3u << 22) | (1u << 19))
static unsigned fp_mode_get(void) {
    uint64_t r;
    __asm__ volatile("mrs %0, fpcr" : "=r"(r));
    return (unsigned)r;
}
static void fp_mode_set(unsigned m) { __asm__ volatile("msr fpcr, %0" : : "r"((uint64_t)m)); }
#else
#define FP_MODE_BITS 0u
static unsigned fp_mode_get(void) { return 0; }
static void fp_mode_set(unsigned m) { (void)m; }
#endif

/* This thread's mode with the mode bits of `want`. */
static void fp_mode_adopt(unsigned want) {
    unsigned now = fp_mode_get();
    unsigned next = (now & ~FP_MODE_BITS) | (want & FP_MODE_BITS);
    if (next != now) fp_mode_set(next);
}

typedef struct {
    ma_chunk_fn body;
    void *ctx;
    size_t nchunks;
    uint32_t gen;
    unsigned fp_mode; /* the caller's, see FP_MODE_BITS */
} job_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t busy = PTHREAD_MUTEX_INITIALIZER; /* one pooled call at a time */
static job_t job;                                         /* guarded by lock */
static int wanted;                                        /* helpers asked to work on `job` */
static int helpers;                                       /* helper threads started */
static _Atomic uint64_t claim;                            /* gen << 32 | next chunk */
static _Atomic size_t done;

static int claim_chunk(uint32_t gen, size_t nchunks, size_t *i) {
    uint64_t w = atomic_load(&claim);
    for (;;) {
        if ((uint32_t)(w >> 32) != gen || (w & 0xffffffffu) >= nchunks) return 0;
        if (atomic_compare_exchange_weak(&claim, &w, w + 1)) {
            *i = (size_t)(w & 0xffffffffu);
            return 1;
        }
    }
}

static void work(const job_t *j) {
    size_t i;
    while (claim_chunk(j->gen, j->nchunks, &i)) {
        j->body(j->ctx, i);
        atomic_fetch_add(&done, 1);
    }
}

static void *helper_main(void *arg) {
    int id = (int)(intptr_t)arg;
    uint32_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&lock);
        while (job.gen == seen || id >= wanted) {
            if (job.gen != seen) seen = job.gen; /* a job not meant for this helper */
            pthread_cond_wait(&wake, &lock);
        }
        job_t j = job;
        seen = j.gen;
        pthread_mutex_unlock(&lock);
        fp_mode_adopt(j.fp_mode);
        work(&j);
    }
    return NULL;
}

static void after_fork_in_child(void) {
    /* the helpers do not exist in the child: start again from none */
    pthread_mutex_init(&lock, NULL);
    pthread_mutex_init(&busy, NULL);
    pthread_cond_init(&wake, NULL);
    helpers = 0;
    wanted = 0;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void init_once(void) { pthread_atfork(NULL, NULL, after_fork_in_child); }

void ma_parallel_for(size_t nchunks, ma_chunk_fn body, void *ctx, int nthreads) {
    size_t i;
    if (nthreads > MAX_HELPERS + 1) nthreads = MAX_HELPERS + 1;
    if (nthreads <= 1 || nchunks <= 1 || nchunks > 0xffffffffu || pthread_mutex_trylock(&busy) != 0) {
        for (i = 0; i < nchunks; i++) body(ctx, i);
        return;
    }
    pthread_once(&once, init_once);
    pthread_mutex_lock(&lock);
    while (helpers < nthreads - 1) {
        pthread_t t;
        if (pthread_create(&t, NULL, helper_main, (void *)(intptr_t)helpers) != 0) break;
        pthread_detach(t);
        helpers++;
    }
    job.body = body;
    job.ctx = ctx;
    job.nchunks = nchunks;
    job.fp_mode = fp_mode_get();
    job.gen++;
    if (job.gen == 0) job.gen = 1; /* 0 means "no job yet" to a new helper */
    wanted = nthreads - 1;
    atomic_store(&done, 0);
    atomic_store(&claim, (uint64_t)job.gen << 32);
    job_t j = job;
    pthread_mutex_unlock(&lock);
    pthread_cond_broadcast(&wake);
    work(&j);
    while (atomic_load(&done) < nchunks) sched_yield(); /* chunks a helper claimed are running */
    pthread_mutex_unlock(&busy);
}
