// PyTorch's pluggable allocator with cacheInfo answered by gmlake (Note [cacheInfo through a subclass] in
// gmlake/torch/_torch_allocator.py). Built by gmlake/torch/_torch_allocator.py against the installed torch's headers,
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

// The bridge's entry points are declared in C++ of their own (gmlake/torch/_bridge.h), without torch's headers;
// these say the types they spell are torch's, so a torch that changes them fails here, at build time.
static_assert(std::is_same_v<cudaStream_t, CUstream_st*>, "cudaStream_t is not struct CUstream_st*");
static_assert(std::is_same_v<c10::cuda::MempoolId_t, std::pair<unsigned long long, unsigned long long>>,
              "c10::cuda::MempoolId_t is not a pair of unsigned long long");

namespace {

namespace pluggable = torch::cuda::CUDAPluggableAllocator;

// The bridge's gmlake_cache_info (gmlake/torch/_torch_bridge.pyx): 0 and the answer, or 1 and the reason.
using CacheInfoFn = int (*)(int device, size_t* largest, char* error, size_t error_size);

struct GmlakeAllocator final : pluggable::CUDAPluggableAllocator {
    GmlakeAllocator(std::function<void*(size_t, int, cudaStream_t)> alloc_fn,
                    std::function<void(void*, size_t, int, cudaStream_t)> free_fn, CacheInfoFn cache_info)
        : pluggable::CUDAPluggableAllocator(std::move(alloc_fn), std::move(free_fn)), cache_info_(cache_info) {}

    // Asked by cuDNN's benchmark (getMaxWorkspaceSize, get_available_workspace) for the largest workspace to try.
    void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
        char error[512] = {0};
        size_t largest = 0;
        TORCH_CHECK(cache_info_(static_cast<int>(device), &largest, error, sizeof(error)) == 0, error);
        *largestBlock = largest;
    }

  private:
    CacheInfoFn cache_info_;
};

// The hooks, by the bridge's symbol names (gmlake/torch/install.py passes each one's address).
struct Hooks {
    uintptr_t alloc = 0, free = 0, init = 0, reset = 0, memory_fraction = 0, base_alloc = 0, record_stream = 0,
              begin_allocate_to_pool = 0, end_allocate_to_pool = 0, release_pool = 0, cache_info = 0;

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
                             "gmlake_end_allocate_to_pool", "gmlake_release_pool", "gmlake_cache_info"}) {
        if (*hooks.slot(name) == 0) {
            say(error, error_size, std::string("gmlake: the allocator shim was given no address for ") + name);
            return 1;
        }
    }
    try {
        auto allocator = std::make_shared<GmlakeAllocator>(
            as<void*(size_t, int, cudaStream_t)>(hooks.alloc),
            as<void(void*, size_t, int, cudaStream_t)>(hooks.free),
            as<int(int, size_t*, char*, size_t)>(hooks.cache_info));
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
