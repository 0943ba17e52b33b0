# The slice of the CUDA driver API that gmlake calls, written out from the public ABI (cuda.h and cudaTypedefs.h),
# so that the `cuda` driver compiles with no CUDA headers and no cuda-bindings, and one build serves CUDA 12 and 13
# drivers. Nothing here is linked: _cuda_driver.pyx fills a CudaApi table at run time through cuGetProcAddress.
#
# An entry point's signature belongs to the CUDA version it is requested for: cuGetProcAddress("cuCtxSynchronize",
# 13000) returns the CUDA 13.0 variant, which takes a context, while 12000 returns the one that takes nothing.
# Every signature below was checked against the 13.0 cudaTypedefs.h for both versions gmlake requests (12000 and
# 13000); cuCtxSynchronize is the only one of them that differs. Requesting any other version needs the same check.
from libc.stdint cimport uint64_t

ctypedef int CUresult                       # an enum in cuda.h, int-sized on every ABI CUDA supports
ctypedef int CUdevice
ctypedef void* CUcontext                    # struct CUctx_st*
ctypedef void* CUstream                     # struct CUstream_st*
ctypedef void* CUevent                      # struct CUevent_st*
ctypedef unsigned long long CUdeviceptr     # 64-bit on LP64
ctypedef unsigned long long CUmemGenericAllocationHandle

cdef enum:
    CUDA_SUCCESS = 0
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_READY = 600
    CU_MEM_ALLOCATION_TYPE_PINNED = 1
    CU_MEM_LOCATION_TYPE_DEVICE = 1
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
    CU_MEM_HANDLE_TYPE_NONE = 0
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
    CU_EVENT_DISABLE_TIMING = 2
    CU_STREAM_CAPTURE_STATUS_NONE = 0
    # cuGetProcAddress flags: the legacy default stream, so stream 0 means what it means to torch and to cuda.h.
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1
    # cuGetProcAddress symbolStatus
    CU_GET_PROC_ADDRESS_SUCCESS = 0
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2

ctypedef struct CUmemLocation:
    int type                                # CUmemLocationType
    int id

ctypedef struct CUmemAllocFlags:
    unsigned char compressionType
    unsigned char gpuDirectRDMACapable
    unsigned short usage
    unsigned char reserved[4]

ctypedef struct CUmemAllocationProp:        # 32 bytes
    int type                                # CUmemAllocationType
    int requestedHandleTypes                # CUmemAllocationHandleType
    CUmemLocation location
    void* win32HandleMetaData
    CUmemAllocFlags allocFlags

ctypedef struct CUmemAccessDesc:
    CUmemLocation location
    int flags                               # CUmemAccess_flags

# Exported by libcuda itself, found with dlsym: the CUDA 12.0 form of cuGetProcAddress, and the driver's version.
ctypedef CUresult (*PFN_cuGetProcAddress_v12000)(const char* symbol, void** pfn, int cudaVersion, uint64_t flags,
                                                 int* symbolStatus) noexcept nogil
ctypedef CUresult (*PFN_cuDriverGetVersion)(int* version) noexcept nogil


# The entry points, as resolved for one CUDA version (`version`, e.g. 12000).
cdef struct CudaApi:
    int version
    CUresult (*cuInit)(unsigned int flags) noexcept nogil
    CUresult (*cuDeviceGet)(CUdevice* device, int ordinal) noexcept nogil
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* ctx, CUdevice dev) noexcept nogil
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice dev) noexcept nogil
    CUresult (*cuCtxGetCurrent)(CUcontext* ctx) noexcept nogil
    CUresult (*cuCtxPushCurrent)(CUcontext ctx) noexcept nogil
    CUresult (*cuCtxPopCurrent)(CUcontext* ctx) noexcept nogil
    CUresult (*cuCtxSynchronize_v2000)() noexcept nogil                 # "cuCtxSynchronize" below CUDA 13.0
    CUresult (*cuCtxSynchronize_v13000)(CUcontext ctx) noexcept nogil   # "cuCtxSynchronize" from CUDA 13.0
    CUresult (*cuMemCreate)(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                            unsigned long long flags) noexcept nogil
    CUresult (*cuMemRelease)(CUmemGenericAllocationHandle handle) noexcept nogil
    CUresult (*cuMemExportToShareableHandle)(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                             int handleType, unsigned long long flags) noexcept nogil
    CUresult (*cuMemAddressReserve)(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                    unsigned long long flags) noexcept nogil
    CUresult (*cuMemAddressFree)(CUdeviceptr ptr, size_t size) noexcept nogil
    CUresult (*cuMemMap)(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags) noexcept nogil
    CUresult (*cuMemUnmap)(CUdeviceptr ptr, size_t size) noexcept nogil
    CUresult (*cuMemSetAccess)(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) noexcept nogil
    CUresult (*cuMemGetAllocationGranularity)(size_t* granularity, const CUmemAllocationProp* prop,
                                              int option) noexcept nogil
    CUresult (*cuMemGetInfo)(size_t* free, size_t* total) noexcept nogil
    CUresult (*cuEventCreate)(CUevent* event, unsigned int flags) noexcept nogil
    CUresult (*cuEventRecord)(CUevent event, CUstream stream) noexcept nogil
    CUresult (*cuEventQuery)(CUevent event) noexcept nogil
    CUresult (*cuEventDestroy)(CUevent event) noexcept nogil
    CUresult (*cuStreamWaitEvent)(CUstream stream, CUevent event, unsigned int flags) noexcept nogil
    CUresult (*cuStreamIsCapturing)(CUstream stream, int* status) noexcept nogil      # CUstreamCaptureStatus
    CUresult (*cuThreadExchangeStreamCaptureMode)(int* mode) noexcept nogil           # CUstreamCaptureMode
    CUresult (*cuMemcpyDtoH)(void* dst, CUdeviceptr src, size_t size) noexcept nogil       # the _v2 entry points
    CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void* src, size_t size) noexcept nogil
    CUresult (*cuGetErrorName)(CUresult error, const char** text) noexcept nogil
    CUresult (*cuGetErrorString)(CUresult error, const char** text) noexcept nogil
