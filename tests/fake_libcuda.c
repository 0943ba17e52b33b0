/* A stand-in for libcuda.so.1 with one device, for testing how gmlake's `cuda` driver finds and calls the driver on
 * machines without one (tests/test_cuda_build.py builds it and points GMLAKE_LIBCUDA at it).
 *
 * Like the real driver it exports only cuDriverGetVersion and cuGetProcAddress_v2 for gmlake's use, and hands out
 * each entry point by name and CUDA version: "cuCtxSynchronize" is the CUDA 2.0 variant (no argument) below 13000
 * and the CUDA 13.0 one (a context) from 13000, as in cudaTypedefs.h. Entry points check their arguments the way
 * gmlake must fill them, and append their names to a log that fake_cuda_log() returns.
 *
 * Environment: FAKE_CUDA_DRIVER_VERSION (default 13000), FAKE_CUDA_NO_ENTRY (an entry point to report missing),
 * FAKE_CUDA_FAIL (an entry point that returns CUDA_ERROR_INVALID_VALUE).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

typedef int CUresult;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

enum {
    SUCCESS = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, INVALID_DEVICE = 101, INVALID_CONTEXT = 201,
    NOT_FOUND = 500, NOT_READY = 600,
};
enum { SYMBOL_FOUND = 0, SYMBOL_NOT_FOUND = 1 };

typedef struct { int type; int id; } Location;
typedef struct {
    int type;
    int requestedHandleTypes;
    Location location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} AllocationProp;
typedef struct { Location location; int flags; } AccessDesc;

#define GRANULARITY (2ull << 20)
#define TOTAL_BYTES (80ull << 30)

static char call_log[1 << 16];
static int initialized;
static int primary_context;                     /* its address is the device's primary context */
static CUcontext current_context;
#define MAX_HANDLES 4096
static unsigned long long next_handle = 1, live_bytes;
static size_t handle_bytes[MAX_HANDLES];        /* by handle; 0 once released */
static int handle_exportable[MAX_HANDLES];      /* by handle: created with the POSIX handle type */
static CUdeviceptr next_va = 0x7f0000000000ull;

static void log_call(const char *name) {
    size_t used = strlen(call_log);
    snprintf(call_log + used, sizeof call_log - used, "%s\n", name);
}

/* Log the call; fail it if FAKE_CUDA_FAIL names it or the driver is not initialised. */
static CUresult enter(const char *name) {
    const char *fail = getenv("FAKE_CUDA_FAIL");
    log_call(name);
    if (fail && strcmp(fail, name) == 0) return INVALID_VALUE;
    if (!initialized && strcmp(name, "cuInit") != 0 && strncmp(name, "cuGetError", 10) != 0) return NOT_INITIALIZED;
    return SUCCESS;
}

#define ENTER(name) do { CUresult rc_ = enter(name); if (rc_ != SUCCESS) return rc_; } while (0)

static int driver_version(void) {
    const char *text = getenv("FAKE_CUDA_DRIVER_VERSION");
    return text ? atoi(text) : 13000;
}

static int is_device_prop(const AllocationProp *prop) {
    return prop && prop->type == 1 && (prop->requestedHandleTypes == 0 || prop->requestedHandleTypes == 1) &&
           prop->location.type == 1 &&
           prop->location.id == 0 && prop->win32HandleMetaData == NULL;
}

static CUresult fake_cuInit(unsigned int flags) { ENTER("cuInit"); initialized = flags == 0; return SUCCESS; }

static CUresult fake_cuDeviceGet(int *device, int ordinal) {
    ENTER("cuDeviceGet");
    if (ordinal != 0) return INVALID_DEVICE;
    *device = 0;
    return SUCCESS;
}

static CUresult fake_cuDevicePrimaryCtxRetain(CUcontext *ctx, int device) {
    ENTER("cuDevicePrimaryCtxRetain");
    *ctx = &primary_context;
    return device == 0 ? SUCCESS : INVALID_DEVICE;
}

static CUresult fake_cuDevicePrimaryCtxRelease(int device) {
    ENTER("cuDevicePrimaryCtxRelease");
    return device == 0 ? SUCCESS : INVALID_DEVICE;
}

static CUresult fake_cuCtxGetCurrent(CUcontext *ctx) { ENTER("cuCtxGetCurrent"); *ctx = current_context; return SUCCESS; }
static CUresult fake_cuCtxPushCurrent(CUcontext ctx) { ENTER("cuCtxPushCurrent"); current_context = ctx; return SUCCESS; }

static CUresult fake_cuCtxPopCurrent(CUcontext *ctx) {
    ENTER("cuCtxPopCurrent");
    *ctx = current_context;
    current_context = NULL;
    return SUCCESS;
}

static CUresult fake_cuCtxSynchronize_v2000(void) {
    ENTER("cuCtxSynchronize(void)");
    return current_context == &primary_context ? SUCCESS : INVALID_CONTEXT;
}

static CUresult fake_cuCtxSynchronize_v13000(CUcontext ctx) {
    ENTER("cuCtxSynchronize(ctx)");
    return ctx == &primary_context ? SUCCESS : INVALID_CONTEXT;
}

static CUresult fake_cuMemCreate(unsigned long long *handle, size_t size, const AllocationProp *prop,
                                 unsigned long long flags) {
    ENTER("cuMemCreate");
    if (!is_device_prop(prop) || flags != 0 || size == 0 || size % GRANULARITY) return INVALID_VALUE;
    if (next_handle == MAX_HANDLES) return 2;    /* CUDA_ERROR_OUT_OF_MEMORY */
    handle_bytes[next_handle] = size;
    handle_exportable[next_handle] = prop->requestedHandleTypes == 1;
    live_bytes += size;
    *handle = next_handle++;
    return SUCCESS;
}

static CUresult fake_cuMemRelease(unsigned long long handle) {
    ENTER("cuMemRelease");
    if (handle == 0 || handle >= next_handle || handle_bytes[handle] == 0) return INVALID_VALUE;
    live_bytes -= handle_bytes[handle];
    handle_bytes[handle] = 0;
    return SUCCESS;
}

/* A chunk created with the POSIX handle type exports a descriptor (of /dev/null: the fake has no pages); any other
   is refused, as the driver refuses it. */
static CUresult fake_cuMemExportToShareableHandle(void *shared, unsigned long long handle, int type,
                                                  unsigned long long flags) {
    ENTER("cuMemExportToShareableHandle");
    if (handle == 0 || handle >= next_handle || handle_bytes[handle] == 0 || type != 1 || flags != 0 ||
        !handle_exportable[handle])
        return INVALID_VALUE;
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return INVALID_VALUE;
    *(int *)shared = fd;
    return SUCCESS;
}

static CUresult fake_cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                         unsigned long long flags) {
    ENTER("cuMemAddressReserve");
    if (size == 0 || size % GRANULARITY || addr != 0 || flags != 0) return INVALID_VALUE;
    if (alignment > GRANULARITY) next_va = (next_va + alignment - 1) / alignment * alignment;
    *ptr = next_va;
    next_va += size;
    return SUCCESS;
}

static CUresult fake_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    ENTER("cuMemAddressFree");
    return ptr != 0 && size % GRANULARITY == 0 ? SUCCESS : INVALID_VALUE;
}

static CUresult fake_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, unsigned long long handle,
                              unsigned long long flags) {
    ENTER("cuMemMap");
    if (handle == 0 || handle >= next_handle || handle_bytes[handle] != size) return INVALID_VALUE;
    return ptr != 0 && offset == 0 && flags == 0 ? SUCCESS : INVALID_VALUE;
}

static CUresult fake_cuMemUnmap(CUdeviceptr ptr, size_t size) {
    ENTER("cuMemUnmap");
    return ptr != 0 && size % GRANULARITY == 0 ? SUCCESS : INVALID_VALUE;
}

static CUresult fake_cuMemSetAccess(CUdeviceptr ptr, size_t size, const AccessDesc *desc, size_t count) {
    ENTER("cuMemSetAccess");
    if (ptr == 0 || size % GRANULARITY || count != 1) return INVALID_VALUE;
    return desc->location.type == 1 && desc->location.id == 0 && desc->flags == 3 ? SUCCESS : INVALID_VALUE;
}

static CUresult fake_cuMemGetAllocationGranularity(size_t *granularity, const AllocationProp *prop, int option) {
    ENTER("cuMemGetAllocationGranularity");
    if (!is_device_prop(prop) || option != 0) return INVALID_VALUE;
    *granularity = GRANULARITY;
    return SUCCESS;
}

static CUresult fake_cuMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    ENTER("cuMemGetInfo");
    if (current_context != &primary_context) return INVALID_CONTEXT;
    *free_bytes = TOTAL_BYTES - live_bytes;
    *total_bytes = TOTAL_BYTES;
    return SUCCESS;
}

static CUresult fake_cuEventCreate(void **event, unsigned int flags) {
    ENTER("cuEventCreate");
    if (flags != 2) return INVALID_VALUE;           /* gmlake's events never time */
    *event = malloc(1);
    return SUCCESS;
}

static CUresult fake_cuEventRecord(void *event, void *stream) { (void)stream; ENTER("cuEventRecord"); return event ? SUCCESS : INVALID_VALUE; }
/* FAKE_CUDA_EVENTS_PENDING=1: no event ever completes (the GPU trails far behind), so fences never hand blocks over. */
static CUresult fake_cuEventQuery(void *event) {
    ENTER("cuEventQuery");
    if (!event) return INVALID_VALUE;
    return getenv("FAKE_CUDA_EVENTS_PENDING") ? NOT_READY : SUCCESS;
}

static CUresult fake_cuStreamWaitEvent(void *stream, void *event, unsigned int flags) {
    (void)stream;                                   /* any stream, the legacy default (NULL) included */
    ENTER("cuStreamWaitEvent");
    return event && flags == 0 ? SUCCESS : INVALID_VALUE;
}

static CUresult fake_cuEventDestroy(void *event) {
    ENTER("cuEventDestroy");
    if (!event) return INVALID_VALUE;
    free(event);
    return SUCCESS;
}

/* FAKE_CUDA_CAPTURING=1: every stream is under a capture the allocator was not told of. Like the real driver, it
   needs a current context (the legacy default stream belongs to one). */
static CUresult fake_cuStreamIsCapturing(void *stream, int *status) {
    (void)stream;
    ENTER("cuStreamIsCapturing");
    if (current_context != &primary_context) return INVALID_CONTEXT;
    const char *capturing = getenv("FAKE_CUDA_CAPTURING");
    *status = capturing && *capturing == '1';
    return SUCCESS;
}

static __thread int capture_mode;                   /* CU_STREAM_CAPTURE_MODE_GLOBAL */
static CUresult fake_cuThreadExchangeStreamCaptureMode(int *mode) {
    ENTER("cuThreadExchangeStreamCaptureMode");
    if (*mode < 0 || *mode > 2) return INVALID_VALUE;
    int previous = capture_mode;
    capture_mode = *mode;
    *mode = previous;
    return SUCCESS;
}

static CUresult fake_cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t size) {
    ENTER("cuMemcpyDtoH");
    return dst && src && size ? SUCCESS : INVALID_VALUE;
}

static CUresult fake_cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t size) {
    ENTER("cuMemcpyHtoD");
    return dst && src && size ? SUCCESS : INVALID_VALUE;
}

static const char *error_name(CUresult error, int description) {
    switch (error) {
    case SUCCESS: return description ? "no error" : "CUDA_SUCCESS";
    case INVALID_VALUE: return description ? "invalid argument" : "CUDA_ERROR_INVALID_VALUE";
    case INVALID_DEVICE: return description ? "invalid device ordinal" : "CUDA_ERROR_INVALID_DEVICE";
    case INVALID_CONTEXT: return description ? "invalid device context" : "CUDA_ERROR_INVALID_CONTEXT";
    default: return NULL;
    }
}

static CUresult fake_cuGetErrorName(CUresult error, const char **text) {
    *text = error_name(error, 0);
    return *text ? SUCCESS : INVALID_VALUE;
}

static CUresult fake_cuGetErrorString(CUresult error, const char **text) {
    *text = error_name(error, 1);
    return *text ? SUCCESS : INVALID_VALUE;
}

static const struct { const char *name; void *function; } entry_points[] = {
    {"cuInit", fake_cuInit},
    {"cuDeviceGet", fake_cuDeviceGet},
    {"cuDevicePrimaryCtxRetain", fake_cuDevicePrimaryCtxRetain},
    {"cuDevicePrimaryCtxRelease", fake_cuDevicePrimaryCtxRelease},
    {"cuCtxGetCurrent", fake_cuCtxGetCurrent},
    {"cuCtxPushCurrent", fake_cuCtxPushCurrent},
    {"cuCtxPopCurrent", fake_cuCtxPopCurrent},
    {"cuMemCreate", fake_cuMemCreate},
    {"cuMemRelease", fake_cuMemRelease},
    {"cuMemExportToShareableHandle", fake_cuMemExportToShareableHandle},
    {"cuMemAddressReserve", fake_cuMemAddressReserve},
    {"cuMemAddressFree", fake_cuMemAddressFree},
    {"cuMemMap", fake_cuMemMap},
    {"cuMemUnmap", fake_cuMemUnmap},
    {"cuMemSetAccess", fake_cuMemSetAccess},
    {"cuMemGetAllocationGranularity", fake_cuMemGetAllocationGranularity},
    {"cuMemGetInfo", fake_cuMemGetInfo},
    {"cuEventCreate", fake_cuEventCreate},
    {"cuEventRecord", fake_cuEventRecord},
    {"cuEventQuery", fake_cuEventQuery},
    {"cuEventDestroy", fake_cuEventDestroy},
    {"cuStreamWaitEvent", fake_cuStreamWaitEvent},
    {"cuStreamIsCapturing", fake_cuStreamIsCapturing},
    {"cuThreadExchangeStreamCaptureMode", fake_cuThreadExchangeStreamCaptureMode},
    {"cuMemcpyDtoH", fake_cuMemcpyDtoH},
    {"cuMemcpyHtoD", fake_cuMemcpyHtoD},
    {"cuGetErrorName", fake_cuGetErrorName},
    {"cuGetErrorString", fake_cuGetErrorString},
};

CUresult cuDriverGetVersion(int *version) {
    *version = driver_version();
    return SUCCESS;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, uint64_t flags, int *status) {
    const char *missing = getenv("FAKE_CUDA_NO_ENTRY");
    char line[160];
    snprintf(line, sizeof line, "resolve %s %d flags=%llu", symbol, cuda_version, (unsigned long long)flags);
    log_call(line);
    *pfn = NULL;
    (void)flags;
    if (!(missing && strcmp(missing, symbol) == 0)) {
        if (strcmp(symbol, "cuCtxSynchronize") == 0) {
            *pfn = cuda_version >= 13000 ? (void *)fake_cuCtxSynchronize_v13000 : (void *)fake_cuCtxSynchronize_v2000;
        }
        for (size_t i = 0; !*pfn && i < sizeof entry_points / sizeof entry_points[0]; i++) {
            if (strcmp(symbol, entry_points[i].name) == 0) *pfn = entry_points[i].function;
        }
    }
    if (status) *status = *pfn ? SYMBOL_FOUND : SYMBOL_NOT_FOUND;
    return *pfn ? SUCCESS : NOT_FOUND;
}

const char *fake_cuda_log(void) { return call_log; }
