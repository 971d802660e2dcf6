/* Memory workloads run inside a container to exercise and measure the Pager
 * (paracell bench memory, tests/integration/test_pager.py).  Static, no libc
 * beyond the basics, so it runs in a busybox rootfs.  Every event is one line
 * on stdout, flushed at once, so the host can time what follows it.
 *
 *   pagerload burst MIB HOLD_MS AFTER_MS   allocate+touch, hold, free, wait
 *   pagerload trace BURSTS GAP_MS          bursts of 16..256 MiB with idle gaps
 *   pagerload retouch MIB WAIT_MS [REPS]   warm re-touch vs re-touch after WAIT_MS,
 *                                          REPS pairs (MIB a multiple of 2)
 *   pagerload churn SECONDS WORKERS        integrity: tagged patterns, verified
 *   pagerload reuse MIB COUNT              a server's pattern: half of MIB, in 64 KiB
 *                                          pieces among the rest, freed and touched
 *                                          again COUNT times
 *   pagerload grow MIB PIECE_KB GAP_MS     a server's heap growing: PIECE_KB at a time,
 *                                          GAP_MS apart, up to MIB, kept
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL
#define MIB (1UL << 20)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0) {}
}

/* MemFree in KiB: the host subtracts it from the guest's RAM size to get
 * what the guest holds, kernel image and struct pages included, which
 * MemTotal leaves out but the host must back all the same. */
static long free_kb(void)
{
    char line[128];
    long value = -1;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemFree: %ld kB", &value) == 1) break;
    fclose(f);
    return value;
}

static char *alloc(size_t bytes)
{
    char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(2); }
    return p;
}

/* One store per page: what a fresh allocation costs, page by page. */
static double touch_us_per_page(char *p, size_t bytes)
{
    double t0 = now_s();
    for (size_t off = 0; off < bytes; off += PAGE) p[off] = (char)off | 1;
    return (now_s() - t0) * 1e6 / (bytes / PAGE);
}

#define CHUNK (2 * MIB)
#define MAX_CHUNKS 512

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The same touch, timed per 2 MiB: whether a slow touch is slow all along
 * (a cost on every page) or in stalls (pages the host had not bound yet).
 * One clock read per 512 pages changes nothing measurable.  Prints the
 * median and the slowest chunk, and the time spent above the median. */
static double touch_profiled(const char *name, char *p, size_t bytes)
{
    static double chunk_us[MAX_CHUNKS], sorted[MAX_CHUNKS];
    size_t chunks = bytes / CHUNK < MAX_CHUNKS ? bytes / CHUNK : MAX_CHUNKS;
    double t0 = now_s(), last = t0;
    for (size_t c = 0; c < chunks; c++) {
        for (size_t off = c * CHUNK; off < (c + 1) * CHUNK; off += PAGE) p[off] = (char)off | 1;
        double t = now_s();
        chunk_us[c] = (t - last) * 1e6;
        last = t;
    }
    double total_us = (last - t0) * 1e6;
    memcpy(sorted, chunk_us, chunks * sizeof sorted[0]);
    qsort(sorted, chunks, sizeof sorted[0], by_value);
    double median = sorted[chunks / 2], excess = 0;
    for (size_t c = 0; c < chunks; c++)
        if (chunk_us[c] > median) excess += chunk_us[c] - median;
    say("chunks %s %zu median_us %.0f max_us %.0f excess_us %.0f", name, chunks, median,
        sorted[chunks - 1], excess);
    return total_us / (chunks * CHUNK / PAGE);
}

/* The guest's Pager counters (/sys/kernel/paracell_pager), or -1 without one. */
static long pager_counter(const char *name)
{
    char path[96];
    long value = -1;
    snprintf(path, sizeof path, "/sys/kernel/paracell_pager/%s", name);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    if (fscanf(f, "%ld", &value) != 1) value = -1;
    fclose(f);
    return value;
}

static const char *const counters[] = {"bound_late_pages", "bound_ahead_pages", "bind_dropped",
                                       "bind_batches"};
#define NCOUNTERS (sizeof counters / sizeof counters[0])

static void read_counters(long *out)
{
    for (size_t i = 0; i < NCOUNTERS; i++) out[i] = pager_counter(counters[i]);
}

/* What the Pager did during one touch: pages bound late (allocated while
 * still unbound) and ahead, records dropped, BIND batches. */
static void say_counters(const long *before, const long *after)
{
    if (before[0] < 0) return;
    char line[256];
    int n = snprintf(line, sizeof line, "pager");
    for (size_t i = 0; i < NCOUNTERS; i++)
        n += snprintf(line + n, sizeof line - n, " %s %ld", counters[i], after[i] - before[i]);
    say("%s", line);
}

/* Allocate and touch, hold, free: every step a line the host can time. */
static void one_burst(size_t mib, long hold_ms)
{
    char *p = alloc(mib * MIB);
    double us = touch_us_per_page(p, mib * MIB);
    say("allocated %zu %.3f %ld", mib, us, free_kb());
    sleep_ms(hold_ms);
    say("freeing %zu", mib);
    munmap(p, mib * MIB);
    say("freed %zu %ld", mib, free_kb());
}

static int burst(size_t mib, long hold_ms, long after_ms)
{
    one_burst(mib, hold_ms);
    sleep_ms(after_ms);
    say("done");
    return 0;
}

static int trace(int bursts, long gap_ms)
{
    static const size_t sizes[] = {16, 256, 64, 128, 32, 256, 48, 192};
    say("idle %ld", free_kb());
    for (int r = 0; r < bursts; r++) {
        one_burst(sizes[r % (sizeof sizes / sizeof sizes[0])], 300);
        sleep_ms(gap_ms);
    }
    say("done");
    return 0;
}

/* REPS times: a warm touch (memory just freed, still backed on the host),
 * then, WAIT_MS later (the host has reclaimed it), a re-touch.  Several
 * pairs in one VM, each a few seconds apart, let the host take the median
 * ratio on a machine whose load changes from second to second. */
static int retouch(size_t mib, long wait_ms, int reps)
{
    size_t bytes = mib * MIB;
    long before[NCOUNTERS], after[NCOUNTERS];
    char *p = alloc(bytes);
    touch_us_per_page(p, bytes);
    munmap(p, bytes);
    for (int r = 0; r < reps; r++) {
        /* At once: the pages just freed are still backed on the host. */
        p = alloc(bytes);
        say("mark warm start");
        double warm = touch_profiled("warm", p, bytes);
        say("mark warm end");
        munmap(p, bytes);
        sleep_ms(wait_ms);
        p = alloc(bytes);
        read_counters(before);
        say("mark retouch start");
        double cold = touch_profiled("retouch", p, bytes);
        say("mark retouch end");
        read_counters(after);
        say_counters(before, after);
        munmap(p, bytes);
        say("warm %.3f", warm);
        say("retouch %.3f", cold);
    }
    say("done");
    return 0;
}

/* Each cache line's first word holds (address, generation, seed): a page that
 * was lost (reads as zeros) or swapped shows as a mismatch. */
static uint64_t tag(const void *addr, uint64_t gen, uint64_t seed)
{
    return ((uint64_t)(uintptr_t)addr * 0x9E3779B97F4A7C15ULL) ^ (gen << 48) ^ seed ^ 1;
}

static void fill(char *p, size_t bytes, uint64_t gen, uint64_t seed)
{
    for (size_t off = 0; off < bytes; off += 64) *(uint64_t *)(p + off) = tag(p + off, gen, seed);
}

static long verify(char *p, size_t bytes, uint64_t gen, uint64_t seed)
{
    long bad = 0;
    for (size_t off = 0; off < bytes; off += 64)
        if (*(uint64_t *)(p + off) != tag(p + off, gen, seed)) bad++;
    return bad;
}

#define SLOTS 12

static int churn_worker(double seconds, uint64_t seed)
{
    struct { char *p; size_t bytes; uint64_t gen; } slot[SLOTS] = {{0}};
    uint64_t gen = 0, rng = seed | 1;
    long bad = 0, cycles = 0;
    double end = now_s() + seconds;
    while (now_s() < end) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        int i = (int)(rng % SLOTS);
        if (slot[i].p) {
            bad += verify(slot[i].p, slot[i].bytes, slot[i].gen, seed);
            munmap(slot[i].p, slot[i].bytes);
            slot[i].p = NULL;
        } else {
            size_t bytes = (size_t)(16 + rng % 1008) * PAGE;  /* 64 KiB .. 4 MiB */
            slot[i].p = alloc(bytes);
            slot[i].bytes = bytes;
            slot[i].gen = ++gen;
            fill(slot[i].p, bytes, slot[i].gen, seed);
        }
        cycles++;
        if (cycles % 64 == 0) sleep_ms(30);  /* let reporting run between bursts */
    }
    for (int i = 0; i < SLOTS; i++)
        if (slot[i].p) bad += verify(slot[i].p, slot[i].bytes, slot[i].gen, seed);
    say("worker %llu cycles %ld mismatches %ld", (unsigned long long)seed, cycles, bad);
    return bad ? 1 : 0;
}

static int churn(double seconds, int workers)
{
    for (int w = 0; w < workers; w++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 2; }
        if (pid == 0) _exit(churn_worker(seconds, 0x1000 + (uint64_t)w));
    }
    int failed = 0, status;
    while (wait(&status) > 0)
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
    say("churn %s", failed ? "FAILED" : "ok");
    return failed ? 1 : 0;
}

/* Every other 64 KiB of a held MIB is freed and touched again, COUNT times
 * back to back: a server's buffers, freed and taken back among memory still
 * in use, so the freed blocks stay small.  The guest kernel has no madvise
 * (tinyconfig), so a piece is freed by mapping a fresh one over it. */
#define REUSE_CHUNK (64 * 1024UL)

static int reuse(size_t mib, long count)
{
    if (mib == 0 || count <= 0) return 2;
    size_t bytes = mib * MIB;
    char *p = alloc(bytes);
    touch_us_per_page(p, bytes);
    double t0 = now_s();
    for (long i = 0; i < count; i++)
        for (size_t off = (size_t)(i & 1) * REUSE_CHUNK; off < bytes; off += 2 * REUSE_CHUNK) {
            if (mmap(p + off, REUSE_CHUNK, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
                perror("mmap");
                return 2;
            }
            touch_us_per_page(p + off, REUSE_CHUNK);
        }
    say("reused %zu MiB %ld times in %.0f ms", mib, count, (now_s() - t0) * 1e3);
    munmap(p, bytes);
    return 0;
}

/* A heap that grows slowly, as a server's does under load: each piece is
 * new memory, most likely reported, taken far slower than a burst takes it. */
static int grow(size_t mib, size_t piece_kb, long gap_ms)
{
    if (mib == 0 || piece_kb == 0 || piece_kb * 1024 > mib * MIB || (piece_kb * 1024) % PAGE)
        return 2;
    size_t bytes = mib * MIB, piece = piece_kb * 1024;
    long before[NCOUNTERS], after[NCOUNTERS];
    char *p = alloc(bytes);
    read_counters(before);
    for (size_t off = 0; off + piece <= bytes; off += piece) {
        touch_us_per_page(p + off, piece);
        sleep_ms(gap_ms);
    }
    read_counters(after);
    say_counters(before, after);
    say("grew %zu MiB", mib);
    munmap(p, bytes);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 5 && !strcmp(argv[1], "burst"))
        return burst(strtoul(argv[2], 0, 10), atol(argv[3]), atol(argv[4]));
    if (argc >= 4 && !strcmp(argv[1], "trace")) return trace(atoi(argv[2]), atol(argv[3]));
    if (argc >= 4 && !strcmp(argv[1], "retouch"))
        return retouch(strtoul(argv[2], 0, 10), atol(argv[3]), argc >= 5 ? atoi(argv[4]) : 1);
    if (argc >= 4 && !strcmp(argv[1], "churn")) return churn(atof(argv[2]), atoi(argv[3]));
    if (argc >= 4 && !strcmp(argv[1], "reuse")) return reuse(strtoul(argv[2], 0, 10), atol(argv[3]));
    if (argc >= 5 && !strcmp(argv[1], "grow"))
        return grow(strtoul(argv[2], 0, 10), strtoul(argv[3], 0, 10), atol(argv[4]));
    fprintf(stderr, "usage: pagerload burst|trace|retouch|churn|reuse|grow ...\n");
    return 2;
}
