// PyTorch's pluggable allocator with cacheInfo answered by gmlake (Note [cacheInfo through a subclass] in
// gmlake/torch/_torch_allocator.py) and CUDA tensors shared between processes (Note [Sharing a tensor through
// PyTorch's handle] in gmlake/torch/_torch_bridge.pyx; built without them where GMLAKE_NO_IPC is defined). Built by gmlake/torch/_torch_allocator.py against the installed torch's headers,
// the CUDA runtime's headers, and its libtorch_cuda, never by setup.py.
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <mutex>
#include <sys/types.h>
#include <unistd.h>

// The bridge's entry points are declared in C++ of their own (gmlake/torch/_bridge.h), without torch's headers;
// these say the types they spell are torch's, so a torch that changes them fails here, at build time.
static_assert(std::is_same_v<cudaStream_t, CUstream_st*>, "cudaStream_t is not struct CUstream_st*");
static_assert(std::is_same_v<c10::cuda::MempoolId_t, std::pair<unsigned long long, unsigned long long>>,
              "c10::cuda::MempoolId_t is not a pair of unsigned long long");

namespace {

namespace pluggable = torch::cuda::CUDAPluggableAllocator;

// The bridge's gmlake_cache_info (gmlake/torch/_torch_bridge.pyx): 0 and the answer, or 1 and the reason.
using CacheInfoFn = int (*)(int device, size_t* largest, char* error, size_t error_size);
// The bridge's gmlake_share_ipc: 0 and the block's pages (offset, page size, descriptors), 2 where `capacity` is
// short of `count`, or 1 and the reason.
using ShareIpcFn = int (*)(void* ptr, size_t* offset, size_t* unit_size, int* fds, size_t capacity, size_t* count,
                           char* error, size_t error_size);
using Native = c10::cuda::CUDACachingAllocator::CUDAAllocator;

#ifndef GMLAKE_NO_IPC
// PyTorch's expandable-segment handle, as torch 2.11's c10/cuda/CUDACachingAllocator.cpp writes it
// (DeviceCachingAllocator::shareIpcHandle, ExpandableSegment::share) and reads it (ExpandableSegment::fromShared): a
// version byte, the type byte, a header {pid_t pid; 4 zero bytes; size_t segment_size; size_t num_handles}, then
// each page's descriptor as an int. The receiver caches opened handles by these bytes, hence the zero padding.
constexpr char kShareableHandleVersion = 2;
constexpr char kShareableExpandableSegment = 'e';
static_assert(sizeof(pid_t) == 4 && sizeof(size_t) == 8 && sizeof(int) == 4, "PyTorch's handle layout assumed");

std::string expandable_segment_handle(size_t page, const std::vector<int>& fds) {
    char header[24] = {0};
    pid_t pid = getpid();
    size_t count = fds.size();
    std::memcpy(header, &pid, sizeof(pid));
    std::memcpy(header + 8, &page, sizeof(page));
    std::memcpy(header + 16, &count, sizeof(count));
    std::string handle;
    handle.push_back(kShareableHandleVersion);
    handle.push_back(kShareableExpandableSegment);
    handle.append(header, sizeof(header));
    for (int fd : fds) handle.append(reinterpret_cast<const char*>(&fd), sizeof(fd));
    return handle;
}
#endif

struct GmlakeAllocator final : pluggable::CUDAPluggableAllocator {
    GmlakeAllocator(std::function<void*(size_t, int, cudaStream_t)> alloc_fn,
                    std::function<void(void*, size_t, int, cudaStream_t)> free_fn, CacheInfoFn cache_info,
                    ShareIpcFn share_ipc, Native* native)
        : pluggable::CUDAPluggableAllocator(std::move(alloc_fn), std::move(free_fn)),
          cache_info_(cache_info),
          share_ipc_(share_ipc),
          native_(native) {}

    // Asked by cuDNN's benchmark (getMaxWorkspaceSize, get_available_workspace) for the largest workspace to try.
    void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
        char error[512] = {0};
        size_t largest = 0;
        TORCH_CHECK(cache_info_(static_cast<int>(device), &largest, error, sizeof(error)) == 0, error);
        *largestBlock = largest;
    }

#ifndef GMLAKE_NO_IPC
    // torch.multiprocessing's sender (THPStorage_shareCuda): the block's pages in PyTorch's expandable-segment
    // handle, the block `offset` bytes in (Note [Sharing a tensor through PyTorch's handle]).
    c10::cuda::CUDACachingAllocator::ShareableHandle shareIpcHandle(void* ptr) override {
        char error[512] = {0};
        size_t offset = 0, page = 0, count = 0;
        std::vector<int> fds(64);
        int rc = 0;
        while ((rc = share_ipc_(ptr, &offset, &page, fds.data(), fds.size(), &count, error, sizeof(error))) == 2)
            fds.resize(count);
        TORCH_CHECK(rc == 0, error);
        fds.resize(count);
        return {static_cast<ptrdiff_t>(offset), expandable_segment_handle(page, fds)};
    }

    // The receiver: PyTorch's native caching allocator opens the handle (gmlake's, or any PyTorch sender's) with
    // its own code, mapping the pages into a range it unmaps when the last tensor over it dies.
    std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
        TORCH_CHECK(native_ != nullptr && native_->name() == "native",
                    "gmlake: cannot open a CUDA tensor from another process: PyTorch's native caching allocator, "
                    "which opens it, was not the allocator gmlake replaced (",
                    native_ == nullptr ? std::string("none") : native_->name(), ")");
        std::call_once(native_ready_, [this] {
            if (!native_->initialized()) native_->init(c10::cuda::device_count());
        });
        return native_->getIpcDevPtr(std::move(handle));
    }
#endif

  private:
    CacheInfoFn cache_info_;
    ShareIpcFn share_ipc_;
    Native* native_;
    std::once_flag native_ready_;
};

// The hooks, by the bridge's symbol names (gmlake/torch/install.py passes each one's address).
struct Hooks {
    uintptr_t alloc = 0, free = 0, init = 0, reset = 0, memory_fraction = 0, base_alloc = 0, record_stream = 0,
              begin_allocate_to_pool = 0, end_allocate_to_pool = 0, release_pool = 0, cache_info = 0, share_ipc = 0;

    uintptr_t* slot(const char* name) {
        struct Named {
            const char* name;
            uintptr_t Hooks::*field;
        };
        static const Named names[] = {
            {"gmlake_alloc", &Hooks::alloc},
            {"gmlake_free", &Hooks::free},
            {"gmlake_init", &Hooks::init},
            {"gmlake_reset", &Hooks::reset},
            {"gmlake_memory_fraction", &Hooks::memory_fraction},
            {"gmlake_base_alloc", &Hooks::base_alloc},
            {"gmlake_record_stream", &Hooks::record_stream},
            {"gmlake_begin_allocate_to_pool", &Hooks::begin_allocate_to_pool},
            {"gmlake_end_allocate_to_pool", &Hooks::end_allocate_to_pool},
            {"gmlake_release_pool", &Hooks::release_pool},
            {"gmlake_cache_info", &Hooks::cache_info},
            {"gmlake_share_ipc", &Hooks::share_ipc},
        };
        for (const Named& n : names)
            if (std::strcmp(n.name, name) == 0) return &(this->*n.field);
        return nullptr;
    }
};

// A function pointer from its address, as torch's own set_*_fn bindings take them (torch/csrc/cuda/Module.cpp).
template <typename Fn>
Fn* as(uintptr_t address) {
    return reinterpret_cast<Fn*>(address);
}

void say(char* error, size_t error_size, const std::string& text) {
    if (error != nullptr && error_size != 0) std::snprintf(error, error_size, "%s", text.c_str());
}

}  // namespace

extern "C" {
// What the shim was built against, so a library left in the cache by another torch is never used.
const char* gmlake_torch_allocator_version() { return GMLAKE_TORCH_VERSION; }

// Make PyTorch's CUDA allocator a CUDAPluggableAllocator over the bridge's hooks (`count` of them, each named in
// `names` with its address in `addresses`: every one of Hooks, no other), whose cacheInfo asks the bridge; what
// torch.cuda.memory.CUDAPluggableAllocator, its set_*_fn calls and change_current_allocator do, with cacheInfo
// added. Returns 0, or 1 with the reason in `error` (torch's own where it refused, as "Can't swap an already
// initialized allocator").
int gmlake_install_torch_allocator(const char* const* names, const uintptr_t* addresses, size_t count, char* error,
                                   size_t error_size) {
    Hooks hooks;
    for (size_t i = 0; i < count; ++i) {
        uintptr_t* slot = hooks.slot(names[i]);
        if (slot == nullptr) {
            say(error, error_size, std::string("gmlake: the allocator shim knows no hook named ") + names[i]);
            return 1;
        }
        *slot = addresses[i];
    }
    for (const char* name : {"gmlake_alloc", "gmlake_free", "gmlake_init", "gmlake_reset", "gmlake_memory_fraction",
                             "gmlake_base_alloc", "gmlake_record_stream", "gmlake_begin_allocate_to_pool",
                             "gmlake_end_allocate_to_pool", "gmlake_release_pool", "gmlake_cache_info",
                             "gmlake_share_ipc"}) {
        if (*hooks.slot(name) == 0) {
            say(error, error_size, std::string("gmlake: the allocator shim was given no address for ") + name);
            return 1;
        }
    }
    try {
        auto allocator = std::make_shared<GmlakeAllocator>(
            as<void*(size_t, int, cudaStream_t)>(hooks.alloc),
            as<void(void*, size_t, int, cudaStream_t)>(hooks.free),
            as<int(int, size_t*, char*, size_t)>(hooks.cache_info),
            as<int(void*, size_t*, size_t*, int*, size_t, size_t*, char*, size_t)>(hooks.share_ipc),
            // PyTorch's own allocator, before changeCurrentAllocator replaces it: it opens shared tensors.
            c10::cuda::CUDACachingAllocator::allocator.load());
        // As torch's createCustomAllocator makes one, before Python sets its hooks.
        allocator->init(0);
        allocator->set_init_fn(as<void(int)>(hooks.init));
        allocator->set_reset_fn(as<void()>(hooks.reset));
        allocator->set_memory_fraction_fn(as<void(double, int)>(hooks.memory_fraction));
        allocator->set_base_alloc_fn(as<void*(void*, size_t*)>(hooks.base_alloc));
        allocator->set_record_stream_fn(as<void(void*, cudaStream_t)>(hooks.record_stream));
        allocator->set_begin_allocate_to_pool(
            as<void(int, c10::cuda::MempoolId_t, std::function<bool(cudaStream_t)>)>(hooks.begin_allocate_to_pool));
        allocator->set_end_allocate_to_pool_fn(as<void(int, c10::cuda::MempoolId_t)>(hooks.end_allocate_to_pool));
        allocator->set_release_pool(as<void(int, c10::cuda::MempoolId_t)>(hooks.release_pool));
        pluggable::changeCurrentAllocator(allocator);
        // Never destroyed (Note [Frees after the interpreter] in _torch_bridge.pyx): torch's static destructors
        // (the limbo of blocks another process still held) free through this object after torch's own pointer to
        // it is gone; destroyed, that call is a "pure virtual method called" abort at exit.
        new std::shared_ptr<GmlakeAllocator>(allocator);
    } catch (const c10::Error& e) {
        say(error, error_size, e.what_without_backtrace());
        return 1;
    } catch (const std::exception& e) {
        say(error, error_size, e.what());
        return 1;
    }
    return 0;
}
}
