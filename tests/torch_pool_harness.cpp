// Stands in for PyTorch's side of the CUDA graph pool hooks, so tests/test_bridge_pools.py can drive the torch
// bridge's routing on a CPU: CUDAPluggableAllocator calls the hooks through function pointers with C++ arguments
// (a std::pair pool id and a std::function stream filter), which ctypes cannot build. Each harness function takes
// the hook's address, as torch's set_* methods do, and turns a thrown error into a return code and a message.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <utility>

struct CUstream_st;
using MempoolId = std::pair<unsigned long long, unsigned long long>;
using Filter = std::function<bool(CUstream_st*)>;
using BeginFn = void (*)(int, MempoolId, Filter);
using PoolFn = void (*)(int, MempoolId);
using AllocFn = void* (*)(size_t, int, void*);
using FractionFn = void (*)(double, int);

static thread_local std::string last_error;
static thread_local std::string last_type;   // the thrown error's dynamic type, as typeid names it (mangled)

template <typename Call>
static int guarded(Call call) {
    try {
        call();
        return 0;
    } catch (const std::exception& e) {
        last_error = e.what();
        last_type = typeid(e).name();
        return 1;
    }
}

extern "C" {
// beginAllocateToPool with a filter that accepts one stream, as torch.cuda.graph's accepts its capture's streams.
int harness_begin(uintptr_t hook, int device, unsigned long long first, unsigned long long second,
                  intptr_t accepted_stream) {
    Filter filter = [accepted_stream](CUstream_st* s) { return reinterpret_cast<intptr_t>(s) == accepted_stream; };
    return guarded([&] { reinterpret_cast<BeginFn>(hook)(device, MempoolId(first, second), filter); });
}

// beginAllocateToPool with a filter that throws when asked, as PyTorch's may where the CUDA runtime fails it.
int harness_begin_throwing(uintptr_t hook, int device, unsigned long long first, unsigned long long second) {
    Filter filter = [](CUstream_st*) -> bool { throw std::runtime_error("the stream filter failed"); };
    return guarded([&] { reinterpret_cast<BeginFn>(hook)(device, MempoolId(first, second), filter); });
}

// endAllocateToPool or releasePool.
int harness_pool(uintptr_t hook, int device, unsigned long long first, unsigned long long second) {
    return guarded([&] { reinterpret_cast<PoolFn>(hook)(device, MempoolId(first, second)); });
}

// The allocation torch makes through the pluggable allocator; 0 and a message if it threw.
uintptr_t harness_alloc(uintptr_t hook, size_t size, int device, intptr_t stream) {
    void* ptr = nullptr;
    if (guarded([&] { ptr = reinterpret_cast<AllocFn>(hook)(size, device, reinterpret_cast<void*>(stream)); }))
        return 0;
    return reinterpret_cast<uintptr_t>(ptr);
}

// set_per_process_memory_fraction's hook; 1 and a message if it threw.
int harness_fraction(uintptr_t hook, double fraction, int device) {
    return guarded([&] { reinterpret_cast<FractionFn>(hook)(fraction, device); });
}

const char* harness_error() { return last_error.c_str(); }

const char* harness_error_type() { return last_type.c_str(); }
}
