/*
 * fake_nvml.c - a stand-in for libnvidia-ml.so.1 for scalene-rs tests, so that
 * GPU profiling can be tested on machines without a GPU.  Tests build it with
 *
 *     cc -shared -fPIC -O2 -o fake_nvml.so tests/support/fake_nvml.c \
 *        [-DFAKE_NVML_NO_V3] [-DFAKE_NVML_NO_PROCESS_UTILIZATION] -lpthread
 *
 * and point SCALENE_RS_NVML_LIB at it.  It exports the read-only NVML calls
 * the profiler uses (NVML's names, C ABI and return codes; the types are
 * declared here by hand) and answers them from a script the test appends to.
 *
 * Script (file named by SCALENE_RS_FAKE_NVML_SCRIPT), one line per change:
 *     <t_us> <device> <pid> <sm_pct> <mem_mib>
 * From wall-clock time t_us (CLOCK_REALTIME, microseconds since epoch) on, <pid> on
 * device <device> uses sm_pct % of the SMs and holds mem_mib MiB, until a
 * later line for the same (device, pid) (for equal times the later line wins);
 * before its first line it is idle.
 * '#' lines, malformed lines and an unfinished last line (no '\n' yet) are
 * ignored.  The file is re-read on every query; a missing file = no processes.
 *
 * Per-process utilization: ticks fall at T_k = T0 + k*P (k >= 1), T0 being
 * the time of the first nvmlInit* and P = SCALENE_RS_FAKE_NVML_PERIOD_MS
 * (default 200).  For each tick <= now and each (device, pid), smUtil is the
 * exact time-weighted mean of the pid's sm% over (T_k - P, T_k], rounded; a
 * sample exists only when that mean is > 0.  Like NVML's bounded buffer, only
 * ticks of the last 10 s, and at most the newest 1000 samples, are answered.
 *
 * Also: SCALENE_RS_FAKE_NVML_DEVICES (default 1, max 8); SCALENE_RS_FAKE_NVML_LOG
 * (file each call appends its name to); SCALENE_RS_FAKE_NVML_FAIL = init |
 * no_device | permission | lost_after:<ms> | hang_after:<ms>.  Thread-safe: one
 * mutex guards the state (never held while a call hangs).
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

/* nvmlReturn_t codes (only those we use). */
enum {
    R_SUCCESS = 0, R_UNINITIALIZED = 1, R_INVALID_ARGUMENT = 2,
    R_NO_PERMISSION = 4, R_NOT_FOUND = 6, R_INSUFFICIENT_SIZE = 7,
    R_DRIVER_NOT_LOADED = 9, R_GPU_IS_LOST = 15, R_UNKNOWN = 999
};

/* Our own declarations of the NVML structs, laid out as NVML's. */
typedef struct { unsigned pid; unsigned long long timeStamp;
                 unsigned smUtil, memUtil, encUtil, decUtil; } util_sample;
typedef struct { unsigned pid; unsigned long long usedGpuMemory;
                 unsigned gpuInstanceId, computeInstanceId; } proc_info_v2;
typedef struct { unsigned pid; unsigned long long usedGpuMemory; } proc_info_v1;
typedef struct { unsigned long long total, free, used; } memory_info;
typedef struct { unsigned gpu, memory; } utilization;

struct fake_device { unsigned index; };
typedef struct fake_device *device_t;          /* nvmlDevice_t */

#define MAX_DEVICES 8
#define MIB (1024.0 * 1024.0)
#define TOTAL_MEMORY (80ULL << 30)             /* 80 GiB */
#define WINDOW_US 10000000LL                   /* keep 10 s of samples */
#define MAX_SAMPLES 1000

enum fail_mode { FAIL_NONE, FAIL_INIT, FAIL_NO_DEVICE, FAIL_PERMISSION,
                 FAIL_LOST, FAIL_HANG };

/* Configuration, read once from the environment. */
static struct {
    const char *script, *log;
    long long period_us, fail_after_us;
    unsigned ndevices;
    enum fail_mode fail;
} cfg;
static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;
static struct fake_device devices[MAX_DEVICES];

/* Mutable state, all guarded by `mu`. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int refcount;                /* nvmlInit / nvmlShutdown nesting */
static long long t0_us = -1;        /* time of the first successful init */

/* One script line.  After loading, `steps` is sorted by (device, pid, t,
 * line number), so each (device, pid) pair is a contiguous run of steps. */
typedef struct { long long t; unsigned dev, pid, seq; double sm, mem; } step;
static step *steps;
static size_t nsteps, steps_cap;
static char *filebuf;
static size_t filebuf_cap;
static const step **now_state;      /* current() result, one per run */
static size_t now_cap;

static long long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

/* Grows *buf (of *cap elements of `size` bytes) to hold at least `need`. */
static int grow(void *buf, size_t *cap, size_t need, size_t size)
{
    size_t n = *cap ? *cap : 64;
    void *p;
    if (need <= *cap)
        return 1;
    while (n < need) n *= 2;
    if (!(p = realloc(*(void **)buf, n * size)))
        return 0;
    *(void **)buf = p, *cap = n;
    return 1;
}

static void read_config(void)
{
    const char *s;
    cfg.script = getenv("SCALENE_RS_FAKE_NVML_SCRIPT");
    cfg.log = getenv("SCALENE_RS_FAKE_NVML_LOG");
    s = getenv("SCALENE_RS_FAKE_NVML_PERIOD_MS");
    cfg.period_us = (s && atoll(s) > 0 ? atoll(s) : 200) * 1000LL;
    s = getenv("SCALENE_RS_FAKE_NVML_DEVICES");
    cfg.ndevices = s ? (unsigned)atoi(s) : 1;
    if (cfg.ndevices > MAX_DEVICES)
        cfg.ndevices = MAX_DEVICES;
    s = getenv("SCALENE_RS_FAKE_NVML_FAIL");
    if (!s || !*s)                          cfg.fail = FAIL_NONE;
    else if (!strcmp(s, "init"))            cfg.fail = FAIL_INIT;
    else if (!strcmp(s, "no_device"))       cfg.fail = FAIL_NO_DEVICE;
    else if (!strcmp(s, "permission"))      cfg.fail = FAIL_PERMISSION;
    else if (!strncmp(s, "lost_after:", 11)) cfg.fail = FAIL_LOST;
    else if (!strncmp(s, "hang_after:", 11)) cfg.fail = FAIL_HANG;
    if (cfg.fail == FAIL_LOST || cfg.fail == FAIL_HANG)
        cfg.fail_after_us = atoll(s + 11) * 1000LL;
    for (unsigned i = 0; i < MAX_DEVICES; i++)
        devices[i].index = i;
}

/* First thing every exported function does: load the configuration and, if
 * asked, append the function's name to the log in one O_APPEND write. */
static void enter(const char *fn)
{
    pthread_once(&cfg_once, read_config);
    if (!cfg.log)
        return;
    int fd = open(cfg.log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    char line[96];
    int n = snprintf(line, sizeof line, "%s\n", fn);
    if (write(fd, line, (size_t)n) < 0) { /* best effort */ }
    close(fd);
}

/* Checks for everything but Init/Shutdown/ErrorString: must be initialised;
 * nvmlDevice* calls also obey lost_after / hang_after. */
static int gate(const char *fn, int device_call)
{
    enter(fn);
    pthread_mutex_lock(&mu);
    int initialised = refcount > 0;
    long long t0 = t0_us;
    pthread_mutex_unlock(&mu);
    if (!initialised) return R_UNINITIALIZED;
    if (device_call && (cfg.fail == FAIL_LOST || cfg.fail == FAIL_HANG)
        && now_us() - t0 >= cfg.fail_after_us) {
        if (cfg.fail == FAIL_LOST)
            return R_GPU_IS_LOST;
        for (;;)                    /* hang forever, not holding the mutex */
            sleep(1);
    }
    return R_SUCCESS;
}

/* gate() for calls taking a device handle; stores its index in *d. */
static int gate_dev(const char *fn, device_t dev, int *d)
{
    int rc = gate(fn, 1);
    if (rc)
        return rc;
    uintptr_t p = (uintptr_t)dev, base = (uintptr_t)devices;
    if (p < base || p >= base + cfg.ndevices * sizeof *devices
        || (p - base) % sizeof *devices)
        return R_INVALID_ARGUMENT;
    *d = (int)dev->index;
    return R_SUCCESS;
}

static int copy_string(char *buf, unsigned len, const char *text)
{
    if (!buf)
        return R_INVALID_ARGUMENT;
    if (strlen(text) + 1 > len)
        return R_INSUFFICIENT_SIZE;
    memcpy(buf, text, strlen(text) + 1);
    return R_SUCCESS;
}

/* ---- the script ------------------------------------------------------- */

static int step_cmp(const void *pa, const void *pb)
{
    const step *a = pa, *b = pb;
    if (a->dev != b->dev) return a->dev < b->dev ? -1 : 1;
    if (a->pid != b->pid) return a->pid < b->pid ? -1 : 1;
    if (a->t != b->t)     return a->t < b->t ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* Parses one complete line into `steps`; skips comments and junk. */
static void parse_line(char *p, unsigned seq)
{
    char *e;
    step s = { .seq = seq };
    s.t = strtoll(p, &e, 10);            if (e == p) return; p = e;
    s.dev = (unsigned)strtoul(p, &e, 10); if (e == p) return; p = e;
    s.pid = (unsigned)strtoul(p, &e, 10); if (e == p) return; p = e;
    s.sm = strtod(p, &e);                 if (e == p) return; p = e;
    s.mem = strtod(p, &e);                if (e == p) return;
    if (s.sm < 0) s.sm = 0;
    if (s.mem < 0) s.mem = 0;
    if (grow(&steps, &steps_cap, nsteps + 1, sizeof *steps))
        steps[nsteps++] = s;
}

/* Re-reads the whole script into `steps`, sorted.  Caller holds mu. */
static void load_script(void)
{
    FILE *f;
    nsteps = 0;
    if (!cfg.script || !(f = fopen(cfg.script, "rb")))
        return;
    size_t len = 0, got;
    while (grow(&filebuf, &filebuf_cap, len + 65536, 1)
           && (got = fread(filebuf + len, 1, filebuf_cap - len, f)) > 0)
        len += got;
    fclose(f);
    /* Only complete lines count: everything after the last '\n' waits. */
    unsigned seq = 0;
    char *line = filebuf, *nl;
    while (len && (nl = memchr(line, '\n', (size_t)(filebuf + len - line)))) {
        *nl = '\0';
        while (*line == ' ' || *line == '\t') line++;
        if (*line != '#')
            parse_line(line, seq++);
        line = nl + 1;
    }
    qsort(steps, nsteps, sizeof *steps, step_cmp);
}

/* End of the (device, pid) run that starts at index lo. */
static size_t run_end(size_t lo)
{
    size_t hi = lo + 1;
    while (hi < nsteps && steps[hi].dev == steps[lo].dev && steps[hi].pid == steps[lo].pid)
        hi++;
    return hi;
}

/* Number of steps in run [lo, hi) with t <= at (binary search). */
static size_t steps_until(size_t lo, size_t hi, long long at)
{
    size_t a = lo, b = hi;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (steps[m].t <= at) a = m + 1; else b = m;
    }
    return a - lo;
}

/* Reloads the script and stores in now_state[] the current step of every
 * pid of device d that has one; returns how many.  Caller holds mu. */
static size_t current(int d)
{
    long long now = now_us();
    size_t n = 0;
    load_script();
    for (size_t lo = 0, hi; lo < nsteps; lo = hi) {
        hi = run_end(lo);
        size_t k = steps_until(lo, hi, now);
        if (steps[lo].dev == (unsigned)d && k > 0
            && grow(&now_state, &now_cap, n + 1, sizeof *now_state))
            now_state[n++] = &steps[lo + k - 1];
    }
    return n;
}

/* ---- init / shutdown / system ----------------------------------------- */

static int do_init(const char *fn)
{
    enter(fn);
    if (cfg.fail == FAIL_INIT)
        return R_DRIVER_NOT_LOADED;
    pthread_mutex_lock(&mu);
    if (refcount++ == 0 && t0_us < 0)
        t0_us = now_us();
    pthread_mutex_unlock(&mu);
    return R_SUCCESS;
}

API int nvmlInit_v2(void) { return do_init("nvmlInit_v2"); }
API int nvmlInit(void) { return do_init("nvmlInit"); }
API int nvmlInitWithFlags(unsigned flags) { (void)flags; return do_init("nvmlInitWithFlags"); }

API int nvmlShutdown(void)
{
    enter("nvmlShutdown");
    pthread_mutex_lock(&mu);
    int rc = refcount > 0 ? (refcount--, R_SUCCESS) : R_UNINITIALIZED;
    pthread_mutex_unlock(&mu);
    return rc;
}

API const char *nvmlErrorString(int rc)
{
    static const char *const text[] = {
        [R_SUCCESS] = "Success", [R_UNINITIALIZED] = "Uninitialized",
        [R_INVALID_ARGUMENT] = "Invalid Argument", [3] = "Not Supported",
        [R_NO_PERMISSION] = "Insufficient Permissions", [R_NOT_FOUND] = "Not Found",
        [R_INSUFFICIENT_SIZE] = "Insufficient Size",
        [R_DRIVER_NOT_LOADED] = "Driver Not Loaded", [R_GPU_IS_LOST] = "GPU is lost",
    };
    enter("nvmlErrorString");
    if (rc >= 0 && rc < (int)(sizeof text / sizeof *text) && text[rc])
        return text[rc];
    return "Unknown Error";
}

/* Driver and NVML versions: fixed texts. */
static int system_text(const char *fn, char *buf, unsigned len, const char *text)
{
    int rc = gate(fn, 0);
    return rc ? rc : copy_string(buf, len, text);
}

API int nvmlSystemGetDriverVersion(char *buf, unsigned len)
{ return system_text("nvmlSystemGetDriverVersion", buf, len, "999.99-fake"); }
API int nvmlSystemGetNVMLVersion(char *buf, unsigned len)
{ return system_text("nvmlSystemGetNVMLVersion", buf, len, "99.999-fake"); }

/* ---- devices ----------------------------------------------------------- */

API int nvmlDeviceGetCount_v2(unsigned *n)
{
    int rc = gate("nvmlDeviceGetCount_v2", 1);
    if (rc) return rc;
    if (!n) return R_INVALID_ARGUMENT;
    *n = cfg.fail == FAIL_NO_DEVICE ? 0 : cfg.ndevices;
    return R_SUCCESS;
}

API int nvmlDeviceGetHandleByIndex_v2(unsigned i, device_t *out)
{
    int rc = gate("nvmlDeviceGetHandleByIndex_v2", 1);
    if (rc) return rc;
    if (!out || cfg.fail == FAIL_NO_DEVICE || i >= cfg.ndevices)
        return R_INVALID_ARGUMENT;
    *out = &devices[i];
    return R_SUCCESS;
}

/* Name and UUID: a fixed text with the device's index in it. */
static int device_text(const char *fn, device_t dev, char *buf, unsigned len, const char *fmt)
{
    char text[32];
    int d, rc = gate_dev(fn, dev, &d);
    if (rc) return rc;
    snprintf(text, sizeof text, fmt, d);
    return copy_string(buf, len, text);
}

API int nvmlDeviceGetName(device_t dev, char *buf, unsigned len)
{ return device_text("nvmlDeviceGetName", dev, buf, len, "Fake GPU %d"); }
API int nvmlDeviceGetUUID(device_t dev, char *buf, unsigned len)
{ return device_text("nvmlDeviceGetUUID", dev, buf, len, "GPU-fake-%d"); }

API int nvmlDeviceGetIndex(device_t dev, unsigned *out)
{
    int d, rc = gate_dev("nvmlDeviceGetIndex", dev, &d);
    if (rc) return rc;
    if (!out) return R_INVALID_ARGUMENT;
    *out = (unsigned)d;
    return R_SUCCESS;
}

API int nvmlDeviceGetMemoryInfo(device_t dev, memory_info *out)
{
    int d, rc = gate_dev("nvmlDeviceGetMemoryInfo", dev, &d);
    if (rc) return rc;
    if (!out) return R_INVALID_ARGUMENT;
    unsigned long long used = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = 0, n = current(d); i < n; i++)
        used += (unsigned long long)(now_state[i]->mem * MIB);
    pthread_mutex_unlock(&mu);
    out->total = TOTAL_MEMORY;
    out->used = used < TOTAL_MEMORY ? used : TOTAL_MEMORY;
    out->free = TOTAL_MEMORY - out->used;
    return R_SUCCESS;
}

API int nvmlDeviceGetUtilizationRates(device_t dev, utilization *out)
{
    int d, rc = gate_dev("nvmlDeviceGetUtilizationRates", dev, &d);
    if (rc) return rc;
    if (!out) return R_INVALID_ARGUMENT;
    double sum = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = 0, n = current(d); i < n; i++)
        sum += now_state[i]->sm;
    pthread_mutex_unlock(&mu);
    out->gpu = sum >= 100 ? 100 : (unsigned)(sum + 0.5);
    out->memory = out->gpu / 2;
    return R_SUCCESS;
}

#ifndef FAKE_NVML_NO_PROCESS_UTILIZATION
/* Exact time-weighted mean of sm% over (from, to] for run [lo, hi). */
static double mean_sm(size_t lo, size_t hi, long long from, long long to)
{
    size_t i = lo + steps_until(lo, hi, from);
    double cur = i > lo ? steps[i - 1].sm : 0.0, area = 0.0;
    long long pos = from;
    for (; i < hi && steps[i].t <= to; i++) {
        area += cur * (double)(steps[i].t - pos);
        pos = steps[i].t;
        cur = steps[i].sm;
    }
    area += cur * (double)(to - pos);
    return area / (double)(to - from);
}

static int sample_cmp(const void *pa, const void *pb)
{
    const util_sample *a = pa, *b = pb;
    if (a->timeStamp != b->timeStamp) return a->timeStamp < b->timeStamp ? -1 : 1;
    return a->pid < b->pid ? -1 : a->pid > b->pid;
}

API int nvmlDeviceGetProcessUtilization(device_t dev, util_sample *buf,
                                        unsigned *count, unsigned long long last)
{
    int d, rc = gate_dev("nvmlDeviceGetProcessUtilization", dev, &d);
    if (rc) return rc;
    if (!count) return R_INVALID_ARGUMENT;
    if (cfg.fail == FAIL_PERMISSION) return R_NO_PERMISSION;

    long long now = now_us(), P = cfg.period_us;
    util_sample *out = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&mu);
    load_script();
    /* Ticks k in [k_lo, k_hi]: after init, <= now, in the last 10 s, > last. */
    long long k_hi = (now - t0_us) / P, k_lo = (now - WINDOW_US - t0_us) / P + 1;
    if (k_lo < 1)
        k_lo = 1;
    if (last >= (unsigned long long)now)
        k_lo = k_hi + 1;                        /* nothing can be newer */
    else if ((long long)last >= t0_us && ((long long)last - t0_us) / P + 1 > k_lo)
        k_lo = ((long long)last - t0_us) / P + 1;
    for (size_t lo = 0, hi; lo < nsteps; lo = hi) {
        hi = run_end(lo);
        for (long long k = k_lo; steps[lo].dev == (unsigned)d && k <= k_hi; k++) {
            long long tk = t0_us + k * P;
            double m = mean_sm(lo, hi, tk - P, tk);
            if (m <= 0)
                continue;
            if (!grow(&out, &cap, n + 1, sizeof *out)) {
                rc = R_UNKNOWN;
                break;
            }
            unsigned sm = m >= 100 ? 100 : (unsigned)(m + 0.5);
            out[n++] = (util_sample){ steps[lo].pid, (unsigned long long)tk, sm, sm / 2, 0, 0 };
        }
    }
    pthread_mutex_unlock(&mu);

    if (n) qsort(out, n, sizeof *out, sample_cmp);
    size_t skip = n > MAX_SAMPLES ? n - MAX_SAMPLES : 0;   /* keep the newest */
    n -= skip;
    if (rc == R_SUCCESS && n == 0)
        *count = 0, rc = R_NOT_FOUND;
    else if (rc == R_SUCCESS && (!buf || *count < n))
        *count = (unsigned)n, rc = R_INSUFFICIENT_SIZE;
    else if (rc == R_SUCCESS) {
        memcpy(buf, out + skip, n * sizeof *out);
        *count = (unsigned)n;
    }
    free(out);
    return rc;
}
#endif

/* Shared body of the GetComputeRunningProcesses versions: lists the pids of
 * the device whose state now has memory or SM use, in the v1 or v2/v3 layout. */
static int running_processes(const char *fn, device_t dev, unsigned *count,
                             void *buf, int v1)
{
    int d, rc = gate_dev(fn, dev, &d);
    if (rc) return rc;
    if (!count) return R_INVALID_ARGUMENT;
    unsigned n = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = 0, nstate = current(d); i < nstate; i++)  /* keep active ones */
        if (now_state[i]->mem > 0 || now_state[i]->sm > 0)
            now_state[n++] = now_state[i];
    if (n > 0 && (!buf || *count < n))
        rc = R_INSUFFICIENT_SIZE;
    for (unsigned i = 0; rc == R_SUCCESS && i < n; i++) {
        unsigned pid = now_state[i]->pid;
        unsigned long long bytes = (unsigned long long)(now_state[i]->mem * MIB);
        if (v1)
            ((proc_info_v1 *)buf)[i] = (proc_info_v1){ pid, bytes };
        else    /* instance ids: "none", as NVML reports outside MIG */
            ((proc_info_v2 *)buf)[i] = (proc_info_v2){ pid, bytes, ~0u, ~0u };
    }
    pthread_mutex_unlock(&mu);
    *count = n;
    return rc;
}

#ifndef FAKE_NVML_NO_V3
API int nvmlDeviceGetComputeRunningProcesses_v3(device_t dev, unsigned *count, proc_info_v2 *buf)
{ return running_processes("nvmlDeviceGetComputeRunningProcesses_v3", dev, count, buf, 0); }
#endif
API int nvmlDeviceGetComputeRunningProcesses_v2(device_t dev, unsigned *count, proc_info_v2 *buf)
{ return running_processes("nvmlDeviceGetComputeRunningProcesses_v2", dev, count, buf, 0); }
API int nvmlDeviceGetComputeRunningProcesses(device_t dev, unsigned *count, proc_info_v1 *buf)
{ return running_processes("nvmlDeviceGetComputeRunningProcesses", dev, count, buf, 1); }
