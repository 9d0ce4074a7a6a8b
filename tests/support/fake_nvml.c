/* A stand-in libnvidia-ml.so.1: NVML's entry points that gpulab's inventory calls, answering
 * for GPUs described in the environment, so that the real nvidia-ml-py binding (pynvml, which
 * loads "libnvidia-ml.so.1" with ctypes) can be tested on a machine without a GPU.
 * tests/support/nvml.py compiles it with `cc` and puts it on a process's library path.
 *
 *   FAKE_NVML_GPUS    "NAME:MIB[:MIG_MIB,MIG_MIB...];NAME:MIB..." one entry per GPU; a third
 *                     field lists the memory of its MIG devices (MIG mode on); "-" there
 *                     means MIG capable but off; no third field: no MIG support. Empty: 0 GPUs.
 *   FAKE_NVML_DRIVER  the driver version (default 550.54.15)
 *   FAKE_NVML_CUDA    the CUDA version the driver supports, as NVML says it (default 12040)
 *   FAKE_NVML_INIT    an NVML return code for nvmlInit (default 0: success; 9: driver not loaded)
 *   FAKE_NVML_USAGE   a file, read again at every call that asks for it (a test changes it while
 *                     the process runs): one line per device, "KEY UTIL USED_MIB", KEY the GPU's
 *                     index ("0") or a MIG device's "GPU:SLOT" ("2:1"); UTIL the percent of
 *                     time a kernel ran. A device not listed (or no file) is idle: 0 %, 0 MiB.
 *                     A MIG device's utilization is "Not Supported", as NVML answers it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SUCCESS 0
#define ERROR_UNINITIALIZED 1
#define ERROR_INVALID_ARGUMENT 2
#define ERROR_NOT_SUPPORTED 3
#define ERROR_NOT_FOUND 6
#define ERROR_INSUFFICIENT_SIZE 7
#define MAX_GPUS 16
#define MAX_MIG 7

typedef struct {
    unsigned long long total, free, used;
} memory_t;

struct dev {
    int index;
    int mig_slot; /* -1: the GPU itself */
    int gpu;
    char name[96];
    unsigned long long mib;
};

static struct dev gpus[MAX_GPUS];
static struct dev migs[MAX_GPUS][MAX_MIG];
static int n_gpus, mig_mode[MAX_GPUS], n_mig[MAX_GPUS], mig_capable[MAX_GPUS], started;

static void parse(void) {
    const char *spec = getenv("FAKE_NVML_GPUS");
    char buf[2048], *save = NULL;
    n_gpus = 0;
    if (!spec) return;
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *entry = strtok_r(buf, ";", &save); entry && n_gpus < MAX_GPUS;
         entry = strtok_r(NULL, ";", &save)) {
        char *fields[3] = {entry, NULL, NULL};
        char *c = strchr(entry, ':');
        if (c) { *c = 0; fields[1] = c + 1; c = strchr(fields[1], ':'); }
        if (c) { *c = 0; fields[2] = c + 1; }
        struct dev *d = &gpus[n_gpus];
        memset(d, 0, sizeof *d);
        d->index = n_gpus;
        d->mig_slot = -1;
        d->gpu = n_gpus;
        snprintf(d->name, sizeof d->name, "%s", fields[0]);
        d->mib = fields[1] ? strtoull(fields[1], NULL, 10) : 0;
        mig_capable[n_gpus] = fields[2] != NULL;
        mig_mode[n_gpus] = fields[2] && strcmp(fields[2], "-") != 0;
        n_mig[n_gpus] = 0;
        if (mig_mode[n_gpus]) {
            char *save2 = NULL;
            for (char *m = strtok_r(fields[2], ",", &save2); m && n_mig[n_gpus] < MAX_MIG;
                 m = strtok_r(NULL, ",", &save2)) {
                struct dev *g = &migs[n_gpus][n_mig[n_gpus]];
                memset(g, 0, sizeof *g);
                g->index = n_mig[n_gpus];
                g->mig_slot = n_mig[n_gpus];
                g->gpu = n_gpus;
                snprintf(g->name, sizeof g->name, "%s", d->name);
                g->mib = strtoull(m, NULL, 10);
                n_mig[n_gpus]++;
            }
        }
        n_gpus++;
    }
}

static int copy(char *out, unsigned int len, const char *text) {
    if (strlen(text) + 1 > len) return ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return SUCCESS;
}

int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    const char *fail = getenv("FAKE_NVML_INIT");
    if (fail && atoi(fail)) return atoi(fail);
    parse();
    started = 1;
    return SUCCESS;
}
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlInit(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) { started = 0; return SUCCESS; }

const char *nvmlErrorString(int result) {
    switch (result) {
    case SUCCESS: return "Success";
    case ERROR_UNINITIALIZED: return "Uninitialized";
    case ERROR_NOT_SUPPORTED: return "Not Supported";
    case ERROR_NOT_FOUND: return "Not Found";
    case 9: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

int nvmlSystemGetDriverVersion(char *version, unsigned int len) {
    const char *v = getenv("FAKE_NVML_DRIVER");
    return copy(version, len, v ? v : "550.54.15");
}

int nvmlSystemGetCudaDriverVersion(int *version) {
    const char *v = getenv("FAKE_NVML_CUDA");
    *version = v ? atoi(v) : 12040;
    return SUCCESS;
}
int nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

int nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!started) return ERROR_UNINITIALIZED;
    *count = (unsigned int)n_gpus;
    return SUCCESS;
}
int nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, struct dev **handle) {
    if (!started) return ERROR_UNINITIALIZED;
    if (index >= (unsigned int)n_gpus) return ERROR_INVALID_ARGUMENT;
    *handle = &gpus[index];
    return SUCCESS;
}
int nvmlDeviceGetHandleByIndex(unsigned int index, struct dev **handle) {
    return nvmlDeviceGetHandleByIndex_v2(index, handle);
}

int nvmlDeviceGetName(struct dev *d, char *name, unsigned int len) {
    if (d->mig_slot < 0) return copy(name, len, d->name);
    char buf[160];
    snprintf(buf, sizeof buf, "%s MIG %d", d->name, d->mig_slot);
    return copy(name, len, buf);
}

int nvmlDeviceGetUUID(struct dev *d, char *uuid, unsigned int len) {
    char buf[96];
    if (d->mig_slot < 0)
        snprintf(buf, sizeof buf, "GPU-fa4e0000-0000-4000-8000-%012d", d->gpu);
    else
        snprintf(buf, sizeof buf, "MIG-fa4e0000-0000-4000-8000-%06d%06d", d->gpu, d->mig_slot);
    return copy(uuid, len, buf);
}

typedef struct {
    unsigned int gpu, memory;
} utilization_t;

/* The device's line of FAKE_NVML_USAGE: its utilization and memory used (0 and 0 if none). */
static void usage_of(const struct dev *d, unsigned int *util, unsigned long long *used_mib) {
    const char *path = getenv("FAKE_NVML_USAGE");
    char key[32], line[256], k[64];
    unsigned int u;
    unsigned long long m;
    *util = 0;
    *used_mib = 0;
    if (!path) return;
    if (d->mig_slot < 0)
        snprintf(key, sizeof key, "%d", d->gpu);
    else
        snprintf(key, sizeof key, "%d:%d", d->gpu, d->mig_slot);
    FILE *f = fopen(path, "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%63s %u %llu", k, &u, &m) == 3 && strcmp(k, key) == 0) {
            *util = u;
            *used_mib = m;
        }
    }
    fclose(f);
}

int nvmlDeviceGetMemoryInfo(struct dev *d, memory_t *memory) {
    unsigned int util;
    unsigned long long used;
    if (!started) return ERROR_UNINITIALIZED;
    usage_of(d, &util, &used);
    memory->total = d->mib * 1024ULL * 1024ULL;
    memory->used = used * 1024ULL * 1024ULL;
    if (memory->used > memory->total) memory->used = memory->total;
    memory->free = memory->total - memory->used;
    return SUCCESS;
}

int nvmlDeviceGetUtilizationRates(struct dev *d, utilization_t *utilization) {
    unsigned long long used;
    if (!started) return ERROR_UNINITIALIZED;
    if (d->mig_slot >= 0) return ERROR_NOT_SUPPORTED;
    usage_of(d, &utilization->gpu, &used);
    utilization->memory = utilization->gpu;
    return SUCCESS;
}

int nvmlDeviceGetMigMode(struct dev *d, unsigned int *current, unsigned int *pending) {
    if (d->mig_slot >= 0 || !mig_capable[d->gpu]) return ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned int)mig_mode[d->gpu];
    return SUCCESS;
}

int nvmlDeviceGetMaxMigDeviceCount(struct dev *d, unsigned int *count) {
    if (d->mig_slot >= 0 || !mig_capable[d->gpu]) return ERROR_NOT_SUPPORTED;
    *count = MAX_MIG;
    return SUCCESS;
}

int nvmlDeviceGetMigDeviceHandleByIndex(struct dev *d, unsigned int index, struct dev **handle) {
    if (d->mig_slot >= 0 || !mig_mode[d->gpu]) return ERROR_NOT_SUPPORTED;
    if (index >= (unsigned int)n_mig[d->gpu]) return ERROR_NOT_FOUND;
    *handle = &migs[d->gpu][index];
    return SUCCESS;
}
