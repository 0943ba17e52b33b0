// The torch bridge's C++: turning an allocation failure into an exception torch reports with our text, and the
// types of PyTorch's CUDA graph pool hooks, spelled from their public ABI so that no torch or CUDA header is needed.
#pragma once
#include <functional>
#include <stdexcept>
#include <utility>

struct CUstream_st;     // cudaStream_t and CUstream are both `struct CUstream_st*`

namespace gmlake {
// Thrown through torch's allocator call; torch turns std::exception into a Python RuntimeError with this message.
[[noreturn]] inline void throw_error(const char* message) { throw std::runtime_error(message); }

// The shim that throws c10::OutOfMemoryError (gmlake/torch/_torch_oom_shim.cc, Note [Torch's out-of-memory type] in
// gmlake/torch/_torch_oom.py); it never returns. Where none was built, the same text goes as a std::runtime_error, which
// begins with PyTorch's words.
using OomThrower = void (*)(const char* message);

[[noreturn]] inline void throw_oom(OomThrower thrower, const char* message) {
    if (thrower) thrower(message);
    throw std::runtime_error(message);
}

// c10::cuda::MempoolId_t: std::pair<CaptureId_t, CaptureId_t>, CaptureId_t being unsigned long long.
using MempoolId = std::pair<unsigned long long, unsigned long long>;
// The filter beginAllocateToPool passes: which streams' requests the pool serves (a capture id, or a thread).
using StreamFilter = std::function<bool(CUstream_st*)>;

inline bool filter_accepts(const StreamFilter& filter, void* stream) {
    return filter && filter(static_cast<CUstream_st*>(stream));
}
}  // namespace gmlake
